import { onAbort } from '../signals.js';

// The core's names for the public waits of signals.ts (one listener per signal, whatever waits).
export { abortableSleep as sleep, whenAborted as aborted } from '../signals.js';

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
        cancel();
        this.#waiters = this.#waiters.filter((waiter) => waiter !== done);
        this.#pending = false;
        resolve();
      };
      const timer = setTimeout(done, ms);
      const cancel = signal ? onAbort(signal, done) : () => undefined;
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
  #queue: { exclusive: boolean; grant: (release: () => void) => void }[] = [];

  /** Resolves with the release function once held; an aborted wait resolves with a no-op. */
  acquire(exclusive: boolean, signal?: AbortSignal): Promise<() => void> {
    if (this.#queue.length === 0 && this.#canGrant(exclusive)) return Promise.resolve(this.#take(exclusive));
    if (signal?.aborted) return Promise.resolve(() => {});
    return new Promise((resolve) => {
      const abandon = () => {
        const index = this.#queue.indexOf(entry);
        if (index < 0) return;
        this.#queue.splice(index, 1);
        resolve(() => {});
        this.#drain();
      };
      // The listener must go once granted: signals live as long as their consumer.
      const entry = {
        exclusive,
        grant: (release: () => void) => {
          cancel();
          resolve(release);
        },
      };
      if (exclusive) {
        const firstShared = this.#queue.findIndex((waiting) => !waiting.exclusive);
        if (firstShared < 0) this.#queue.push(entry);
        else this.#queue.splice(firstShared, 0, entry);
      } else this.#queue.push(entry);
      const cancel = signal ? onAbort(signal, abandon) : () => undefined;
    });
  }

  #canGrant(exclusive: boolean): boolean {
    return exclusive ? !this.#exclusive && this.#shared === 0 : !this.#exclusive;
  }

  /** Records a holder and returns its (idempotent) release. */
  #take(exclusive: boolean): () => void {
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
      next.grant(this.#take(next.exclusive));
      if (next.exclusive) return;
    }
  }
}
