import type { Delivery } from '@courier/core';
import { withSettles } from '../support/wrap-transport.js';

/** How a delivery was settled. */
type Settle = 'ack' | 'retry' | 'deadLetter';

/**
 * Follows the broker's deliveries of one message through a wrapped subscription, so a bus
 * case can wait until the consumer is done with the message — something that happens —
 * instead of sleeping for "long enough for another run to have committed, had it run".
 *
 * The consumer settles a delivery only after its inbox run committed or failed, and its
 * handling returns only after that settle; so once no handling is in hand and the broker's
 * last settle was final (an ack or a dead letter: a retry brings another delivery), every
 * run the message got has committed or never will. That holds however slow the machine is.
 */
export class DeliveryWatch {
  #inHand = 0;
  #final = 0;
  /** Retries not yet followed by the redelivery they ask for. */
  #retriesOwed = 0;
  readonly #settles: Settle[] = [];

  /** `delivery` with its settles recorded: they are the broker's (its redelivery after a retry is expected). */
  track(delivery: Delivery): Delivery {
    if (this.#retriesOwed > 0) this.#retriesOwed -= 1;
    const record = (settle: Settle) => {
      this.#settles.push(settle);
      if (settle === 'retry') this.#retriesOwed += 1;
      else this.#final += 1;
    };
    return withSettles(delivery, {
      ack: async () => {
        await delivery.ack();
        record('ack');
      },
      retry: async (delayMs, reason) => {
        await delivery.retry(delayMs, reason);
        record('retry');
      },
      deadLetter: async (reason) => {
        await delivery.deadLetter(reason);
        record('deadLetter');
      },
    });
  }

  /** Counts `handling` (the handlers of one delivery and of any copies of it) as in hand until it settles; never rejects. */
  async during(handling: Promise<unknown>): Promise<void> {
    this.#inHand += 1;
    try {
      await handling;
    } catch {
      // The consumer's handler does not throw; one that did still returned.
    } finally {
      this.#inHand -= 1;
    }
  }

  /** Whether the consumer is done: nothing in hand, no retry owed, and at least `finalSettles` deliveries acknowledged or dead-lettered. */
  done(finalSettles = 1): boolean {
    return this.#inHand === 0 && this.#retriesOwed === 0 && this.#final >= finalSettles;
  }

  /** What was seen, for an assertion's message. */
  describe(): string {
    return `${this.#inHand} in hand, settles so far: ${this.#settles.join(', ') || 'none'}`;
  }
}
