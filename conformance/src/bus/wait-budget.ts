// The time a scenario run may still spend waiting before its deadline. Runs in-process and
// in processes share it, so every run cut short says so in the same words.

/**
 * The time a run may still spend waiting: each of its bounds is cut to it. Ends `reserveMs`
 * before the deadline, which is kept for what follows the last wait (the diagnosis of an
 * unsettled run, stopping workers, closing fixtures). Without a deadline the bounds apply
 * as they are.
 */
export class WaitBudget {
  readonly #endsAt: number;

  constructor(deadline: number | undefined, reserveMs: number) {
    this.#endsAt = deadline === undefined ? Number.POSITIVE_INFINITY : deadline - reserveMs;
  }

  /** `boundMs`, or less when the budget ends sooner; `cut` says which. */
  wait(boundMs: number): { ms: number; cut: boolean } {
    const left = Math.max(0, this.#endsAt - Date.now());
    return left < boundMs ? { ms: left, cut: true } : { ms: boundMs, cut: false };
  }
}

/** The words that say a wait was cut short by the run's deadline, for an error message. */
export function cutNote(cut: boolean): string {
  return cut ? ' (cut short: that was all the time left before the case\'s deadline, which keeps the verdict ahead of the test runner\'s timeout)' : '';
}

/**
 * The line a failed settle gets when the deadline cut its wait (`who` were given it), so the
 * reader knows the run was stopped early rather than given its full bound; '' otherwise.
 */
export function settleCutNote(who: string, wait: { ms: number; cut: boolean }): string {
  return wait.cut ? `\n(${who} given ${seconds(wait.ms)} to settle: all the time left before the case's deadline, which keeps the verdict ahead of the test runner's timeout)` : '';
}

/** `ms` as whole seconds, for messages. */
export function seconds(ms: number): string {
  return `${Math.round(ms / 1000)} s`;
}

/** Thrown by {@link within} when a step does not finish in its time. */
export class StepTimeout extends Error {
  override readonly name = 'StepTimeout';
}

/**
 * `promise`, or a rejection with a {@link StepTimeout} naming `what` once `wait.ms` passed
 * without it settling. The step itself is not cancelled (nothing here can cancel it); the
 * run stops waiting for it so that it can report which step hung.
 */
export async function within<T>(promise: Promise<T>, wait: { ms: number; cut: boolean }, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new StepTimeout(`${what} did not finish in ${seconds(wait.ms)}${cutNote(wait.cut)}`)), wait.ms);
    timer.unref();
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
