import { courierProject } from '../../vitest.shared.js';

// Every CLI test runs the binary as child processes, several seconds each on a loaded
// machine; the binary is compiled once per run first (test/support/build-cli.ts).
export default courierProject('cli', { testTimeout: 600_000, globalSetup: ['test/support/build-cli.ts'] });
