// Two copies of @courier/core in one process (an app bundling its own, or `courier relay`,
// whose tsx loads the config's stores and transport under their own module namespace):
// an error built by one copy must be `instanceof` the other copy's classes, or the relay
// drops its code from the stored error text and the consumer mistakes a retriable storage
// error for a handler failure (issue 35).
import { describe, expect, it } from 'vitest';
import * as here from '../src/errors.js';

// A query string makes Vite load the file as a module of its own: a second copy.
// (A variable, so TypeScript does not look for a file named so.)
const secondCopy = '../src/errors.ts?second-copy';
const other = (await import(/* @vite-ignore */ secondCopy)) as typeof here;

describe('Courier errors across two copies of the module', () => {
  it('the test really has two copies', () => {
    expect(other.CourierError).not.toBe(here.CourierError);
    expect(Function.prototype[Symbol.hasInstance].call(here.CourierError, new other.StorageError('x'))).toBe(false);
  });

  it("another copy's errors are instances of this copy's classes of the same kind, and of no other", () => {
    const storage = new other.StorageError('connection lost', { retriable: true });
    expect(storage instanceof here.StorageError).toBe(true);
    expect(storage instanceof here.CourierError).toBe(true);
    expect(storage instanceof Error).toBe(true);
    expect(storage instanceof here.TransportError).toBe(false);
    expect(new other.UnrecoverableError('no') instanceof here.UnrecoverableError).toBe(true);
    expect(new other.SerializationError('PAYLOAD_INVALID', 'bad') instanceof here.UnrecoverableError).toBe(false);
    expect(new other.ConfigError('x') instanceof here.ConfigError).toBe(true);
    expect(new other.ClosedError('x') instanceof here.ClosedError).toBe(true);
    expect(new Error('plain') instanceof here.CourierError).toBe(false);
    expect((null as unknown) instanceof here.CourierError).toBe(false);
    expect(('text' as unknown) instanceof here.CourierError).toBe(false);
  });

  it('describeError keeps the code and isRetriable the flag of an error from another copy', () => {
    const error = new other.TransportError('unroutable', { code: 'PUBLISH_UNROUTABLE', retriable: false });
    expect(here.describeError(error)).toBe('TransportError [PUBLISH_UNROUTABLE]: unroutable');
    expect(here.isRetriable(error)).toBe(false);
  });

  it("a subclass written outside Courier matches its own instances only, not its base class's", () => {
    class PaymentDeclined extends here.UnrecoverableError {}
    expect(new PaymentDeclined('declined') instanceof PaymentDeclined).toBe(true);
    expect(new PaymentDeclined('declined') instanceof here.UnrecoverableError).toBe(true);
    expect(new PaymentDeclined('declined') instanceof other.UnrecoverableError).toBe(true);
    expect(new here.UnrecoverableError('no') instanceof PaymentDeclined).toBe(false);
    expect(new other.UnrecoverableError('no') instanceof PaymentDeclined).toBe(false);
  });
});
