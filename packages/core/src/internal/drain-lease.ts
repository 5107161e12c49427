import { describeError } from '../errors.js';
import type { InboxHalts } from '../inbox-store.js';
import type { Logger } from '../logger.js';
import { aborted } from './async.js';

/** Renewals per lease length while a drain holds a resumed key. */
const RENEWALS_PER_LEASE = 3;
/** Share of the lease after which a drain with no successful renewal takes its claim for lost (the database may already count it expired). */
const LEASE_BUDGET = 0.8;

/** Where a {@link DrainLease} renews: one resumed key of one consumer, held by one owner. */
export interface DrainLeaseTarget {
  readonly halts: Pick<InboxHalts, 'renewDrain'>;
  readonly consumer: string;
  readonly topic: string;
  readonly key: string;
  readonly owner: string;
  readonly leaseMs: number;
  readonly logger: Logger;
}

/**
 * Keeps a drain's claim on a resumed key alive while the drain works on it: renews it every
 * third of the lease (`InboxHalts.renewDrain`, one call at a time) until `stop`, whatever a
 * step is doing (a handler running long, a held message backing off between retries).
 *
 * Guarantees: `lost` aborts when a renewal says the claim is gone (another drainer took it,
 * the halt changed hands), or when no renewal has succeeded for `LEASE_BUDGET` of a lease
 * (the store was unreachable: the database may already count it expired); it never
 * un-aborts. A failed renewal is retried at the next beat. `stop` clears every timer and
 * waits for a renewal in flight, but no longer than the lease's budget.
 */
export class DrainLease {
  readonly #lost = new AbortController();
  readonly #target: DrainLeaseTarget;
  #beat: ReturnType<typeof setTimeout> | undefined;
  #lapse: ReturnType<typeof setTimeout> | undefined;
  #renewing: Promise<void> | undefined;
  #stopped = false;

  /**
   * Starts renewing a claim taken at `heldSince` (local clock, taken before the claim).
   * `abandon` stops the renewals for good (the drain's work was abandoned, as a dead
   * process's is: the claim runs out and another instance takes the key).
   */
  constructor(target: DrainLeaseTarget, heldSince: number, abandon?: AbortSignal) {
    this.#target = target;
    this.#holdFrom(heldSince);
    this.#schedule();
    abandon?.addEventListener('abort', () => void this.stop(), { once: true });
    if (abandon?.aborted) void this.stop();
  }

  /** Aborts once the claim can no longer be trusted (see the class guarantees). */
  get lost(): AbortSignal {
    return this.#lost.signal;
  }

  /** Stops renewing (idempotent); resolves once a renewal in flight has ended. */
  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#beat);
    // A renewal that never answers must not hold the drain loop: waited for only until the
    // claim could lapse.
    if (this.#renewing) await Promise.race([this.#renewing, aborted(this.#lost.signal)]);
    clearTimeout(this.#lapse);
  }

  #holdFrom(since: number): void {
    clearTimeout(this.#lapse);
    const lapseIn = since + this.#target.leaseMs * LEASE_BUDGET - Date.now();
    if (lapseIn <= 0) return this.#lose('drain could not renew its claim on a resumed key in time; it stops draining the key');
    this.#lapse = setTimeout(() => this.#lose('drain could not renew its claim on a resumed key in time; it stops draining the key'), lapseIn);
    // A drain that outlives its process's other work must not keep the process alive.
    this.#lapse.unref?.();
  }

  #lose(message: string): void {
    if (this.#lost.signal.aborted) return;
    clearTimeout(this.#lapse);
    clearTimeout(this.#beat);
    this.#lost.abort();
    if (!this.#stopped) {
      const { consumer, topic, key } = this.#target;
      this.#target.logger.warn(message, { consumer, topic, key });
    }
  }

  #schedule(): void {
    if (this.#stopped || this.#lost.signal.aborted) return;
    this.#beat = setTimeout(() => {
      this.#renewing = this.#tick().finally(() => {
        this.#renewing = undefined;
        this.#schedule();
      });
    }, this.#target.leaseMs / RENEWALS_PER_LEASE);
    this.#beat.unref?.();
  }

  async #tick(): Promise<void> {
    const startedAt = Date.now();
    const { halts, consumer, topic, key, owner, logger } = this.#target;
    try {
      const renewed = await halts.renewDrain(consumer, topic, key, owner);
      if (this.#stopped || this.#lost.signal.aborted) return;
      if (renewed) this.#holdFrom(startedAt);
      else this.#lose('drain lost its claim on a resumed key (its lease ran out or another instance took it); it stops draining the key');
    } catch (error) {
      // The next beat retries; the lapse timer bounds how long the drain goes on meanwhile.
      if (!this.#stopped) logger.warn('drain lease renewal failed; retrying', { consumer, topic, key, error: describeError(error) });
    }
  }
}
