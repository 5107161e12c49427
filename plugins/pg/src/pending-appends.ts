import type { ClientBase } from 'pg';

// Appends still being written, per client: withTransaction awaits them before COMMIT. Keyed
// weakly by the client, so nothing outlives the client and no two clients share an entry.
const pending = new WeakMap<ClientBase, Set<Promise<void>>>();

/** Records `written` as an append in flight on `client` until it settles. */
export function trackAppend(client: ClientBase, written: Promise<void>): void {
  let set = pending.get(client);
  if (!set) {
    set = new Set();
    pending.set(client, set);
  }
  const entry = written.then(
    () => undefined,
    () => undefined,
  );
  set.add(written);
  void entry.then(() => set.delete(written));
}

/**
 * Waits for every append in flight on `client`, including ones started while waiting, and
 * rejects with the first failure among them (the transaction must then roll back).
 */
export async function settleAppends(client: ClientBase): Promise<void> {
  let failure: { error: unknown } | undefined;
  for (let set = pending.get(client); set !== undefined && set.size > 0; set = pending.get(client)) {
    const batch = [...set];
    for (const written of batch) set.delete(written);
    await Promise.all(batch.map((written) => written.catch((error: unknown) => void (failure ??= { error }))));
  }
  if (failure !== undefined) throw failure.error;
}
