import { failureGroupId, normaliseErrorMessage, type Envelope, type FailureFacts, type OutboxOperations, type TransportDeadLetters } from '@courier/core';
import { UsageError } from './format.js';

/**
 * One parked message as `courier dead` shows it, from either place a message can be
 * parked: a dead (or halted) outbox row, never published; or a transport dead letter,
 * published and refused by a consumer.
 */
export interface ParkedMessage {
  /** What `show`, `replay` and `purge` take: `outbox:<sequence>` or `dlq:<consumer>:<id>`. */
  readonly ref: string;
  readonly source: 'outbox' | 'transport';
  /** `dead` or `halted` outbox row, or `dead-letter` for a transport dead letter. */
  readonly state: 'dead' | 'halted' | 'dead-letter';
  readonly consumer: string | null;
  readonly envelope: Envelope;
  /** The error code: the reason's code, or the `[CODE]` in an outbox row's last error. */
  readonly code: string | null;
  readonly error: string | null;
  readonly attempts: number;
  /** When it was parked; null when the store did not record it. */
  readonly parkedAt: Date | null;
}

/** Filters of the `courier dead` commands; every given one must match. */
export interface ParkedFilter {
  readonly source?: 'outbox' | 'transport' | 'all';
  readonly topic?: string;
  readonly type?: string;
  readonly consumer?: string;
  readonly code?: string;
  /** Parked at least this long ago. */
  readonly olderThanMs?: number;
  /** Only members of this failure group (the id `courier dead groups` prints). */
  readonly group?: string;
}

/** Where the parked messages live, as the config provides them. */
export interface ParkingPlaces {
  readonly outbox?: OutboxOperations;
  readonly deadLetters?: TransportDeadLetters;
  readonly consumers: readonly string[];
}

const PAGE = 500;
/** Most dead letters read per consumer (RabbitMQ reads through its queue: a bound on one command's work). */
const TRANSPORT_READ_LIMIT = 10_000;

/**
 * Notes for the consumers whose dead letters were not all read (more than
 * {@link TRANSPORT_READ_LIMIT}, as the transport's `count` tells): a listing that left some
 * out says so, with how many.
 */
export async function unreadTransportLetters(places: ParkingPlaces, filter: ParkedFilter, found: readonly ParkedMessage[]): Promise<string[]> {
  const deadLetters = places.deadLetters;
  if ((filter.source ?? 'all') === 'outbox' || !deadLetters?.count) return [];
  const notes: string[] = [];
  for (const consumer of filter.consumer !== undefined ? [filter.consumer] : places.consumers) {
    const total = await deadLetters.count(consumer);
    if (total > TRANSPORT_READ_LIMIT) notes.push(`dead letters of '${consumer}': read ${TRANSPORT_READ_LIMIT} of ${total} (${found.filter((item) => item.consumer === consumer).length} matched); replay or purge them to see the rest`);
  }
  return notes;
}

/** Lists parked messages matching `filter`, outbox rows first (by sequence), then each consumer's dead letters. */
export async function listParked(places: ParkingPlaces, filter: ParkedFilter, limit: number): Promise<ParkedMessage[]> {
  const found: ParkedMessage[] = [];
  const source = filter.source ?? 'all';
  if (source !== 'transport' && places.outbox && filter.consumer === undefined) {
    let after: bigint | undefined;
    for (;;) {
      const page = await places.outbox.listDead({ limit: PAGE, ...(after !== undefined ? { after } : {}), ...(filter.topic !== undefined ? { topic: filter.topic } : {}) });
      for (const row of page) {
        const item: ParkedMessage = {
          ref: `outbox:${row.sequence}`,
          source: 'outbox',
          state: row.state,
          consumer: null,
          envelope: row.envelope,
          code: /\[([A-Z0-9_]+)\]/.exec(row.lastError ?? '')?.[1] ?? null,
          error: row.lastError,
          attempts: row.attempts,
          parkedAt: row.failedAt,
        };
        if (matches(item, filter)) found.push(item);
        if (found.length >= limit) return found;
      }
      if (page.length < PAGE) break;
      after = page[page.length - 1]!.sequence;
    }
  }
  if (source !== 'outbox' && places.deadLetters) {
    const consumers = filter.consumer !== undefined ? [filter.consumer] : places.consumers;
    for (const consumer of consumers) {
      for (const letter of await places.deadLetters.list(consumer, { limit: TRANSPORT_READ_LIMIT })) {
        const item: ParkedMessage = {
          ref: `dlq:${consumer}:${letter.id}`,
          source: 'transport',
          state: 'dead-letter',
          consumer,
          envelope: letter.envelope,
          code: letter.reason.code,
          error: letter.reason.message,
          attempts: letter.attempt,
          parkedAt: letter.deadAt,
        };
        if (matches(item, filter)) found.push(item);
        if (found.length >= limit) return found;
      }
    }
  }
  return found;
}

function matches(item: ParkedMessage, filter: ParkedFilter): boolean {
  if (filter.topic !== undefined && item.envelope.topic !== filter.topic) return false;
  if (filter.type !== undefined && item.envelope.type !== filter.type) return false;
  if (filter.consumer !== undefined && item.consumer !== filter.consumer) return false;
  if (filter.code !== undefined && item.code !== filter.code) return false;
  if (filter.olderThanMs !== undefined && (item.parkedAt === null || Date.now() - item.parkedAt.getTime() < filter.olderThanMs)) return false;
  if (filter.group !== undefined && groupOf(item) !== filter.group) return false;
  return true;
}

/** What a parked message contributes to its failure group (core's `groupFailures`). */
export function failureFacts(item: ParkedMessage): FailureFacts {
  return { type: item.envelope.type, code: item.code, error: item.error, consumer: item.consumer, at: item.parkedAt };
}

/** The failure group id of a parked message, as `courier dead groups` prints it. */
export function groupOf(item: ParkedMessage): string {
  const facts = failureFacts(item);
  return failureGroupId(facts.type, facts.code, normaliseErrorMessage(facts.error), facts.consumer);
}

/** A parsed reference. */
export type ParkedRef = { readonly source: 'outbox'; readonly sequence: bigint } | { readonly source: 'transport'; readonly consumer: string; readonly id: string };

/** Parses `outbox:<sequence>` or `dlq:<consumer>:<id>`; throws a `UsageError` naming the bad one. */
export function parseRef(ref: string): ParkedRef {
  const outbox = /^outbox:(\d+)$/.exec(ref);
  if (outbox) return { source: 'outbox', sequence: BigInt(outbox[1]!) };
  const dlq = /^dlq:([^:]+):(.+)$/.exec(ref);
  if (dlq) return { source: 'transport', consumer: dlq[1]!, id: dlq[2]! };
  throw new UsageError(`'${ref}' is not a dead letter reference (write outbox:<sequence> or dlq:<consumer>:<id>, as \`courier dead list\` prints them)`);
}

/**
 * Replays (`action` replay) or purges parked messages: outbox rows through the outbox's
 * `replay`/`purge`, transport dead letters through `deadLetters` per consumer. Returns
 * how many each place changed (a place reports fewer when some were already gone).
 */
export async function actOnParked(places: ParkingPlaces, items: readonly ParkedMessage[], action: 'replay' | 'purge'): Promise<{ outbox: number; transport: number }> {
  const sequences: bigint[] = [];
  const byConsumer = new Map<string, string[]>();
  for (const item of items) {
    const ref = parseRef(item.ref);
    if (ref.source === 'outbox') sequences.push(ref.sequence);
    else byConsumer.set(ref.consumer, [...(byConsumer.get(ref.consumer) ?? []), ref.id]);
  }
  let outbox = 0;
  let transport = 0;
  if (sequences.length > 0) {
    if (!places.outbox) throw new UsageError('the config has no outbox, so outbox dead rows cannot be changed');
    outbox = action === 'replay' ? await places.outbox.replay(sequences) : await places.outbox.purge(sequences);
  }
  for (const [consumer, ids] of byConsumer) {
    if (!places.deadLetters) throw new UsageError('the config has no transport with dead letters (`transport.deadLetters`)');
    transport += action === 'replay' ? await places.deadLetters.replay(consumer, ids) : await places.deadLetters.purge(consumer, ids);
  }
  return { outbox, transport };
}

/** Finds the parked messages named by `refs` (each must exist), for show, replay and purge by reference. */
export async function findParked(places: ParkingPlaces, refs: readonly string[]): Promise<ParkedMessage[]> {
  const wanted = refs.map(parseRef);
  const all = await listParked(places, {}, Number.MAX_SAFE_INTEGER);
  const byRef = new Map(all.map((item) => [item.ref, item]));
  // Consumers not in the config's list are looked up too: a reference may name any.
  for (const ref of wanted) {
    if (ref.source === 'transport' && !places.consumers.includes(ref.consumer) && places.deadLetters) {
      for (const item of await listParked({ ...places, consumers: [ref.consumer] }, { source: 'transport' }, Number.MAX_SAFE_INTEGER)) byRef.set(item.ref, item);
    }
  }
  const missing = refs.filter((ref) => !byRef.has(ref));
  if (missing.length > 0) throw new NotFoundError(`no dead letter ${missing.map((ref) => `'${ref}'`).join(', ')} (list them with \`courier dead list\`)`);
  return refs.map((ref) => byRef.get(ref)!);
}

/** A referenced dead letter or halted key does not exist (exit code 1). */
export class NotFoundError extends Error {
  override readonly name = 'NotFoundError';
}
