// When a client is given up: at once after a disconnect or a failure on the connection, or
// after a timeout once it has answered before; a client that never answered (still
// connecting) only once it outlived a patience that doubles with each client given up that
// way and drops back after an answer. Fake clients and a fake clock: the rule alone.
import type { ServiceBusClient } from '@azure/service-bus';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ClientSource } from '../src/client-source.js';

const fakeClient = () => ({ close: vi.fn(async () => undefined) }) as unknown as ServiceBusClient;

describe('ClientSource', () => {
  beforeEach(() => {
    vi.useFakeTimers({ toFake: ['Date'] });
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('a timeout gives up a client that never answered only after the patience, which doubles with each such client and resets after an answer', () => {
    const source = new ClientSource(fakeClient, { patienceMs: 1_000 });
    expect(source.lost(0, { timedOut: true }), 'still connecting: kept').toBe(false);
    vi.advanceTimersByTime(1_000);
    expect(source.lost(0, { timedOut: true })).toBe(true);
    expect(source.current.generation).toBe(1);
    // The next one gets twice as long.
    vi.advanceTimersByTime(1_500);
    expect(source.lost(1, { timedOut: true })).toBe(false);
    vi.advanceTimersByTime(500);
    expect(source.lost(1, { timedOut: true })).toBe(true);
    // An answer: the client is connected, and a later timeout means the connection is gone.
    source.answered(2);
    expect(source.lost(2, { timedOut: true })).toBe(true);
    // And the patience is back to its start for the next fresh client.
    vi.advanceTimersByTime(1_000);
    expect(source.lost(3, { timedOut: true })).toBe(true);
  });

  it('a failure on the connection or a disconnect gives up even a client that never answered, at once', () => {
    const made: ServiceBusClient[] = [];
    const source = new ClientSource(() => {
      const client = fakeClient();
      made.push(client);
      return client;
    }, { patienceMs: 60_000 });
    expect(source.lost(0)).toBe(true);
    expect(source.current.client).toBe(made[1]);
    expect(made[0]!.close).toHaveBeenCalled();
    // A report about a client already given up changes nothing.
    expect(source.lost(0)).toBe(false);
  });

  it('a client instance of the user is never replaced nor closed', async () => {
    const client = fakeClient();
    const source = new ClientSource(client);
    vi.advanceTimersByTime(600_000);
    expect(source.lost(0, { timedOut: true })).toBe(false);
    expect(source.lost(0)).toBe(false);
    await source.close();
    expect(client.close).not.toHaveBeenCalled();
  });
});

// A given-up client's close can hang for the SDK's 60 s operation timeout (its connection is
// dead); `close()` must not hold `bus.stop()` that long, while a live client's orderly close
// is still waited for in full. Fake timers: the bound alone, whatever the machine's load.
describe('ClientSource.close', () => {
  beforeEach(() => {
    vi.useFakeTimers({ toFake: ['Date', 'setTimeout', 'clearTimeout'] });
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  const settledWithin = async (promise: Promise<unknown>, ms: number): Promise<boolean> => {
    let settled = false;
    void promise.finally(() => {
      settled = true;
    });
    await vi.advanceTimersByTimeAsync(ms);
    return settled;
  };

  it('abandons a replaced client whose close never resolves after the bound, and logs it', async () => {
    const hanging = { close: vi.fn(() => new Promise<void>(() => {})) } as unknown as ServiceBusClient;
    const made = [hanging];
    const warn = vi.fn();
    const logger = { debug: vi.fn(), info: vi.fn(), warn, error: vi.fn() };
    const source = new ClientSource(() => made.shift() ?? fakeClient(), { abandonCloseAfterMs: 2_000, logger });
    expect(source.lost(0)).toBe(true);
    expect(await settledWithin(source.close(), 2_000), 'close() resolved within the bound').toBe(true);
    expect(warn).toHaveBeenCalledWith(expect.stringContaining('abandon'), expect.objectContaining({ generation: 0 }));
  });

  it('waits for the live client\'s orderly close however long it takes', async () => {
    const slow = { close: vi.fn(() => new Promise<void>((resolve) => setTimeout(resolve, 10_000))) } as unknown as ServiceBusClient;
    const source = new ClientSource(() => slow, { abandonCloseAfterMs: 2_000 });
    const closing = source.close();
    expect(await settledWithin(closing, 9_000), 'still waiting for the live client').toBe(false);
    expect(await settledWithin(closing, 1_000)).toBe(true);
  });
});
