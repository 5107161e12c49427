/**
 * Waiting on long-lived AbortSignals without leaving anything on them.
 *
 * A subscription's or a relay's stop signal lives as long as the process, and the code
 * around it waits on it thousands of times a day: a retry delay per message, a lease renewal
 * every few seconds, a deadline per batch. Two things the platform offers go wrong there:
 *
 * - one `'abort'` listener per wait: a wait that ends by its timer must remove it, or they
 *   pile up without end; and even when every wait cleans up, more than ten waits pending at
 *   once on one signal (a busy consumer whose downstream is away has hundreds of retries
 *   parked) make Node print "Possible EventTarget memory leak detected" into the user's logs
 *   for a consumer that leaks nothing;
 * - `AbortSignal.any`: on Node 20 each call keeps an entry in every input's dependants for as
 *   long as that input lives (measured on v20.20.2: a million calls on one signal left a
 *   million entries, ~70 MB, after forced full GCs).
 *
 * So every wait here registers in one set per signal, and the signal carries a single
 * listener for that set however many waits are pending; a wait that ends removes itself.
 * Transport plugins use these for the same reason the core does.
 */

const NOTHING = (): void => undefined;

/** The callbacks waiting on each signal; the signal holds the only listener, which runs them all. */
const waiting = new WeakMap<AbortSignal, Set<() => void>>();

/**
 * Calls `callback` once when `signal` aborts, and returns a function that cancels that (call
 * it when the wait ends some other way). A signal that has already aborted calls `callback`
 * at once, synchronously — an `'abort'` listener added after the abort would never run.
 *
 * Guarantees: however many callbacks are registered on one signal, it carries one `'abort'`
 * listener of this module; a cancelled callback is released (nothing of it stays reachable
 * from the signal); each callback runs at most once; a callback that throws does not stop
 * the others (the error is reported as uncaught, as a listener's would be).
 */
export function onAbort(signal: AbortSignal, callback: () => void): () => void {
  if (signal.aborted) {
    callback();
    return NOTHING;
  }
  let callbacks = waiting.get(signal);
  if (!callbacks) {
    const registered = new Set<() => void>();
    callbacks = registered;
    waiting.set(signal, registered);
    signal.addEventListener(
      'abort',
      () => {
        waiting.delete(signal);
        const due = [...registered];
        registered.clear();
        for (const run of due) {
          try {
            run();
          } catch (error) {
            queueMicrotask(() => {
              throw error;
            });
          }
        }
      },
      { once: true },
    );
  }
  // A wrapper per registration, so the same function registered twice is two waits.
  const entry = () => callback();
  callbacks.add(entry);
  const registered = callbacks;
  return () => void registered.delete(entry);
}

/**
 * Resolves after `ms`, or early (never rejecting) when `signal` aborts — at once when it
 * already has. Whichever ends it, nothing of the wait stays on the signal.
 */
export function abortableSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (!signal) {
      setTimeout(resolve, ms);
      return;
    }
    if (signal.aborted) return resolve();
    const timer = setTimeout(() => {
      cancel();
      resolve();
    }, ms);
    const cancel = onAbort(signal, () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/**
 * Resolves once `signal` has aborted — at once when it already has. Meant for a wait that
 * lasts until the signal's end (a close racing a start); a promise raced and dropped keeps
 * its registration until the signal aborts, so for repeated waits use {@link onAbort} and
 * cancel.
 */
export function whenAborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => void onAbort(signal, resolve));
}

/** A signal of its own, aborted by any of its parents or a deadline; `dispose` ends the link. */
export interface LinkedSignal {
  /** Aborts when any parent aborts (at once if one already has) or the deadline passes. */
  readonly signal: AbortSignal;
  /** Clears the deadline and releases the parents' registrations; the signal keeps its state. Idempotent. */
  dispose(): void;
  /** Aborts the signal now (a child's own stop, the parents untouched) and disposes. */
  abort(): void;
}

/**
 * A signal that aborts with any of `parents`, or after `timeoutMs` when one is given and
 * finite. What `AbortSignal.any` (plus `AbortSignal.timeout`) does, without its Node 20
 * retention: after `dispose` nothing of the link stays on the parents, so a link per batch,
 * per retry or per receiver on a signal that lives for days costs nothing once it ends.
 * Always call `dispose` when the work it bounded is done.
 */
export function linkSignals(parents: readonly AbortSignal[], timeoutMs?: number): LinkedSignal {
  const controller = new AbortController();
  const cancels: (() => void)[] = [];
  let timer: NodeJS.Timeout | undefined;
  const dispose = () => {
    clearTimeout(timer);
    for (const cancel of cancels.splice(0)) cancel();
  };
  const abort = () => {
    controller.abort();
    dispose();
  };
  for (const parent of parents) {
    if (controller.signal.aborted) break;
    cancels.push(onAbort(parent, abort));
  }
  if (!controller.signal.aborted && timeoutMs !== undefined && Number.isFinite(timeoutMs)) timer = setTimeout(abort, Math.max(0, timeoutMs));
  return { signal: controller.signal, dispose, abort };
}
