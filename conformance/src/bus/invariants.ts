import type { DeadLetter, DeadOutboxRecord, HaltedKey } from '@courier/core';

/** What the suite knows it committed (and rolled back), to hold the end state against. */
export class Ledger {
  /** messageId → (key, seq) in commit order. */
  readonly committed = new Map<string, { readonly key: string | null; readonly seq: number }>();
  readonly rolledBack = new Set<string>();

  commit(messageId: string, key: string | null, seq: number): void {
    this.committed.set(messageId, { key, seq });
  }
}

/** The observed end state after a scenario. */
export interface Observed {
  /** Committed effect ids (messageIds) in commit order, duplicates included. */
  readonly effects: readonly string[];
  /** Dead letters held by the transport for the consumer. */
  readonly consumerDead: readonly DeadLetter[];
  /** Dead rows in the outbox. */
  readonly outboxDead: readonly DeadOutboxRecord[];
  /** Keys halted in the outbox, with what they hold. */
  readonly halted: readonly HaltedKey[];
}

/** The three end states a committed message may be in. */
export type EndState = 'applied' | 'dead-lettered' | 'halted';

/** The outcome of {@link checkInvariants}: a problem list (empty when every invariant holds) and the tallies. */
export interface InvariantReport {
  readonly problems: readonly string[];
  readonly applied: number;
  readonly deadLettered: number;
  readonly halted: number;
  readonly committed: number;
}

/**
 * Checks the invariants every scenario must end with:
 * - every committed message is in exactly one end state: applied once, dead-lettered
 *   (by the relay or the consumer), or held on a halted key;
 * - no effect is applied twice;
 * - nothing from a rolled-back transaction is published, applied or dead-lettered;
 * - for ordered subscriptions, effects of each key are applied in commit order;
 * - the counts reconcile: applied + dead-lettered + halted = committed.
 *
 * `heldOnHaltedKey` lists messages held behind a halted head (they are still pending by design).
 */
export function checkInvariants(ledger: Ledger, observed: Observed, options: { ordered: boolean; heldOnHaltedKey?: ReadonlySet<string> }): InvariantReport {
  const problems: string[] = [];
  const applied = new Map<string, number>();
  for (const id of observed.effects) applied.set(id, (applied.get(id) ?? 0) + 1);
  const dead = new Map<string, number>();
  for (const letter of observed.consumerDead) dead.set(letter.envelope.messageId, (dead.get(letter.envelope.messageId) ?? 0) + 1);
  for (const row of observed.outboxDead) {
    if (row.state === 'dead') dead.set(row.envelope.messageId, (dead.get(row.envelope.messageId) ?? 0) + 1);
  }
  const halted = new Set<string>(observed.halted.map((key) => key.head.envelope.messageId));
  for (const id of options.heldOnHaltedKey ?? []) halted.add(id);

  let appliedCount = 0;
  let deadCount = 0;
  let haltedCount = 0;
  for (const [id] of ledger.committed) {
    const times = applied.get(id) ?? 0;
    const deadTimes = dead.get(id) ?? 0;
    const isHalted = halted.has(id);
    const states = (times > 0 ? 1 : 0) + (deadTimes > 0 ? 1 : 0) + (isHalted ? 1 : 0);
    if (times > 1) problems.push(`message ${id} was applied ${times} times`);
    if (deadTimes > 1) {
      const reasons = observed.consumerDead.filter((letter) => letter.envelope.messageId === id).map((letter) => `${letter.reason.code} at attempt ${letter.attempt}`);
      problems.push(`message ${id} was dead-lettered ${deadTimes} times (${reasons.join(', ') || 'in the outbox'})`);
    }
    if (states === 0) problems.push(`message ${id} was lost: not applied, not dead-lettered, not halted`);
    if (states > 1) problems.push(`message ${id} is in ${states} end states at once`);
    if (times > 0) appliedCount += 1;
    else if (deadTimes > 0) deadCount += 1;
    else if (isHalted) haltedCount += 1;
  }
  for (const id of ledger.rolledBack) {
    if (applied.has(id) || dead.has(id)) problems.push(`message ${id} from a rolled-back transaction was delivered`);
  }
  for (const id of applied.keys()) {
    if (!ledger.committed.has(id) && !ledger.rolledBack.has(id)) problems.push(`effect ${id} belongs to no committed message`);
  }
  if (options.ordered) {
    const lastSeq = new Map<string, number>();
    const seen = new Set<string>();
    for (const id of observed.effects) {
      if (seen.has(id)) continue;
      seen.add(id);
      const entry = ledger.committed.get(id);
      if (!entry || entry.key === null) continue;
      const previous = lastSeq.get(entry.key);
      if (previous !== undefined && entry.seq < previous) {
        problems.push(`key '${entry.key}': message seq ${entry.seq} was applied after seq ${previous}`);
      }
      lastSeq.set(entry.key, entry.seq);
    }
  }
  if (appliedCount + deadCount + haltedCount !== ledger.committed.size && problems.length === 0) {
    problems.push(`counts do not reconcile: ${appliedCount} applied + ${deadCount} dead + ${haltedCount} halted != ${ledger.committed.size} committed`);
  }
  return { problems, applied: appliedCount, deadLettered: deadCount, halted: haltedCount, committed: ledger.committed.size };
}
