import { setTimeout as sleep } from 'node:timers/promises';

/** Per-call arguments of {@link eventually}. */
export interface EventuallyOptions {
  /** Give up after this long. Default 5 s. */
  readonly timeoutMs?: number;
  /** Pause between tries. Default 10 ms. */
  readonly intervalMs?: number;
}

/**
 * Calls `check` until it returns (or resolves) without throwing and returns its value:
 * bounded polling, the one way the suites wait for something to happen.
 *
 * Guarantees: tries at least once; after `timeoutMs` rethrows the last error of `check`
 * (an assertion keeps its diff) with the time waited prefixed to its message.
 */
export async function eventually<T>(check: () => T | Promise<T>, options: EventuallyOptions = {}): Promise<T> {
  const timeoutMs = options.timeoutMs ?? 5_000;
  const intervalMs = options.intervalMs ?? 10;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await check();
    } catch (error) {
      if (Date.now() >= deadline) {
        if (error instanceof Error) {
          error.message = `not met within ${timeoutMs} ms: ${error.message}`;
          throw error;
        }
        throw new Error(`not met within ${timeoutMs} ms: ${String(error)}`, { cause: error });
      }
    }
    await sleep(intervalMs);
  }
}
