/**
 * The global a worker bundle's entry leaves the fixture module in (see worker-bundle.ts), for
 * the worker script to take instead of importing the module a second time. Its own file, so
 * the worker does not load the bundler.
 */
export const BUNDLED_FIXTURE = Symbol.for('courier.conformance.bundledFixture');
