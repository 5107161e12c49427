/** Resolves after `ms`, or early (without rejecting) when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done, { once: true });
  });
}

/** A wake-up flag: `wait` resolves on the next `notify`, on timeout, or on abort, whichever is first. */
export class Waker {
  #pending = false;
  #waiters: (() => void)[] = [];

  notify(): void {
    this.#pending = true;
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const wake of waiters) wake();
  }

  wait(ms: number, signal?: AbortSignal): Promise<void> {
    if (this.#pending || signal?.aborted) {
      this.#pending = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', done);
        this.#waiters = this.#waiters.filter((waiter) => waiter !== done);
        this.#pending = false;
        resolve();
      };
      const timer = setTimeout(done, ms);
      signal?.addEventListener('abort', done, { once: true });
      this.#waiters.push(done);
    });
  }
}

/** Resolves with `promise`'s settlement or with `undefined` after `ms`, never rejecting on timeout. */
export async function withTimeout<T>(promise: Promise<T>, ms: number): Promise<{ done: true; value: T } | { done: false }> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<{ done: false }>((resolve) => {
    timer = setTimeout(() => resolve({ done: false }), ms);
  });
  try {
    return await Promise.race([promise.then((value) => ({ done: true as const, value })), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A readers–writer gate: many shared holders at once, or one exclusive holder alone.
 * Waiting exclusive holders go first, so a suspect message is never starved.
 */
export class Gate {
  #shared = 0;
  #exclusive = false;
  #queue: { exclusive: boolean; grant: () => void }[] = [];

  async acquire(exclusive: boolean, signal?: AbortSignal): Promise<() => void> {
    if (this.#canGrant(exclusive) && this.#queue.length === 0) return this.#grant(exclusive);
    await new Promise<void>((resolve) => {
      const entry = { exclusive, grant: () => resolve() };
      if (exclusive) {
        const firstShared = this.#queue.findIndex((waiting) => !waiting.exclusive);
        if (firstShared < 0) this.#queue.push(entry);
        else this.#queue.splice(firstShared, 0, entry);
      } else this.#queue.push(entry);
      signal?.addEventListener('abort', () => {
        const index = this.#queue.indexOf(entry);
        if (index >= 0) this.#queue.splice(index, 1);
        resolve();
      }, { once: true });
    });
    if (signal?.aborted) return () => {};
    return this.#grant(exclusive);
  }

  #canGrant(exclusive: boolean): boolean {
    return exclusive ? !this.#exclusive && this.#shared === 0 : !this.#exclusive;
  }

  #grant(exclusive: boolean): () => void {
    if (exclusive) this.#exclusive = true;
    else this.#shared += 1;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      if (exclusive) this.#exclusive = false;
      else this.#shared -= 1;
      this.#drain();
    };
  }

  #drain(): void {
    while (this.#queue.length > 0 && this.#canGrant(this.#queue[0]!.exclusive)) {
      const next = this.#queue.shift()!;
      if (next.exclusive) this.#exclusive = true;
      else this.#shared += 1;
      next.grant();
      if (next.exclusive) return;
    }
  }
}
