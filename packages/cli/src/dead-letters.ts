import { failureGroupId, normaliseErrorMessage, type Envelope, type FailureFacts, type InboxHalts, type OutboxOperations, type TransportDeadLetters } from '@courier/core';
import { UsageError } from './format.js';

/**
 * One parked message as `courier dead` shows it, from any place a message can be parked: a
 * dead (or halted) outbox row, never published; a consumer's head parked by
 * `courier halted resume --consumer … --park`, kept by the inbox store (`InboxHalts.listParked`);
 * or a transport dead letter, published and refused by a consumer.
 */
export interface ParkedMessage {
  /**
   * What `show`, `replay` and `purge` take: `outbox:<sequence>`, `parked:<consumer>:<messageId>`
   * or `dlq:<consumer>:<id>`.
   */
  readonly ref: string;
  readonly source: 'outbox' | 'inbox' | 'transport';
  /** `dead` or `halted` outbox row, `parked` consumer head, or `dead-letter` for a transport dead letter. */
  readonly state: 'dead' | 'halted' | 'parked' | 'dead-letter';
  readonly consumer: string | null;
  readonly envelope: Envelope;
  /**
   * The error code: the reason's code; an outbox row's stored code (schema version 5), or for
   * a row dead-lettered before it, the `[CODE]` of the relay's `Name [CODE]: message` text;
   * or the `CODE:` a parked head's error starts with (the consumer stores `<code>: <message>`).
   */
  readonly code: string | null;
  /** Outbox rows: the failure's error class name (`TransportError`); null when unknown or not an outbox row. */
  readonly errorName?: string | null;
  /** Outbox rows: when the row first failed since its append or last replay; null when unknown. */
  readonly firstFailedAt?: Date | null;
  readonly error: string | null;
  /** Delivery attempts; null for a parked head (the inbox store does not keep them). */
  readonly attempts: number | null;
  /** When it was parked; null when the store did not record it. */
  readonly parkedAt: Date | null;
  /**
   * Its position in the listing's order, as `courier dead list --after` takes it: the next
   * page starts after the last item's cursor. Absent only for a parked head of an inbox store
   * that gives no `seq` (it cannot be paged).
   */
  readonly cursor?: string;
}

/** Filters of the `courier dead` commands; every given one must match. */
export interface ParkedFilter {
  /** `inbox`: consumers' parked heads only. */
  readonly source?: 'outbox' | 'inbox' | 'transport' | 'all';
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
  /** The inbox store's parked heads (every consumer's: the store lists them without being told the consumers). */
  readonly inbox?: Pick<InboxHalts, 'listParked' | 'replayParked' | 'purgeParked' | 'countParked'>;
  readonly deadLetters?: TransportDeadLetters;
  readonly consumers: readonly string[];
}

const PAGE = 500;
/** Most dead letters read per consumer (RabbitMQ reads through its queue: a bound on one command's work). */
const TRANSPORT_READ_LIMIT = 10_000;
/** Most parked heads read from an inbox store that gives no `seq` (so cannot be paged): a bound on one command's work. */
const PARKED_READ_LIMIT = 10_000;

/**
 * A note when more parked heads exist than one command reads ({@link PARKED_READ_LIMIT}): only
 * for an inbox store that gives no `seq` (the listing pages every other store's heads in full).
 */
export async function unreadParkedHeads(places: ParkingPlaces, filter: ParkedFilter): Promise<string[]> {
  const source = filter.source ?? 'all';
  if (!places.inbox || (source !== 'all' && source !== 'inbox')) return [];
  const read = await places.inbox.listParked({ ...(filter.consumer !== undefined ? { consumer: filter.consumer } : {}), limit: PARKED_READ_LIMIT + 1 });
  if (read[0]?.seq !== undefined) return [];
  return read.length > PARKED_READ_LIMIT ? [`parked consumer heads: read the oldest ${PARKED_READ_LIMIT}, more exist (narrow with --consumer)`] : [];
}

/**
 * Notes for the consumers whose dead letters were not all read: the transport's `count` (a
 * depth the broker keeps, read without taking anything) is above what its `list` returned,
 * because one command reads at most {@link TRANSPORT_READ_LIMIT}, or because the transport
 * cannot browse further without hiding messages from other readers (SQS: a receive with
 * visibility 0 keeps returning the same first messages on some servers). `read` is what the
 * listing read per consumer ({@link listParked}'s `reads`). A listing that left some out says
 * so, with how many: "N of M", never silently.
 */
export async function unreadTransportLetters(places: ParkingPlaces, read: ReadonlyMap<string, number>): Promise<string[]> {
  const count = places.deadLetters?.count?.bind(places.deadLetters);
  if (!count) return [];
  const notes: string[] = [];
  for (const [consumer, seen] of read) {
    const total = await count(consumer);
    if (total <= seen) continue;
    const why = seen >= TRANSPORT_READ_LIMIT ? 'the most one command reads' : 'the transport could not read the rest without hiding them from other readers, or they came since';
    notes.push(`dead letters of '${consumer}': read ${seen} of ${total} the broker counts (${why}); replay or purge those shown to reach the rest`);
  }
  return notes;
}

/**
 * A position in the order {@link listParked} lists in: outbox rows by sequence, then parked
 * heads by the store's `seq`, then per consumer (in the order given) transport dead letters
 * by (deadAt, id). Every item has one, and none moves when others leave the list.
 */
type Position =
  | { readonly part: 'outbox'; readonly seq: bigint }
  | { readonly part: 'inbox'; readonly seq: bigint }
  | { readonly part: 'transport'; readonly consumer: string; readonly deadAtMs: number; readonly id: string };

const PART_ORDER = { outbox: 0, inbox: 1, transport: 2 } as const;

function encodeCursor(position: Position): string {
  const fields = position.part === 'transport' ? ['t', position.consumer, String(position.deadAtMs), position.id] : [position.part === 'outbox' ? 'o' : 'i', position.seq.toString()];
  return Buffer.from(JSON.stringify(fields)).toString('base64url');
}

/**
 * Reads a cursor as `courier dead list` printed it (an opaque string); throws a `UsageError`
 * naming it when it is not one.
 */
export function parseCursor(cursor: string): Position {
  const bad = new UsageError(`--after '${cursor}' is not a cursor (pass the one \`courier dead list\` printed, or an item's "cursor" in its --json)`);
  let fields: unknown;
  try {
    fields = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
  } catch {
    throw bad;
  }
  if (!Array.isArray(fields) || !fields.every((field) => typeof field === 'string')) throw bad;
  const [kind, ...rest] = fields as string[];
  if ((kind === 'o' || kind === 'i') && rest.length === 1 && /^\d+$/.test(rest[0]!)) return { part: kind === 'o' ? 'outbox' : 'inbox', seq: BigInt(rest[0]!) };
  if (kind === 't' && rest.length === 3 && /^\d+$/.test(rest[1]!)) return { part: 'transport', consumer: rest[0]!, deadAtMs: Number(rest[1]), id: rest[2]! };
  throw bad;
}

/** One page of {@link listParkedPage}. */
export interface ParkedPage {
  readonly items: readonly ParkedMessage[];
  /** Per consumer, how many transport dead letters the page read (for {@link unreadTransportLetters}). */
  readonly transportRead: ReadonlyMap<string, number>;
  /** The cursor to pass as `after` for the next page; null when nothing follows. */
  readonly next: string | null;
}

/**
 * One page of the parked messages matching `filter`, after the cursor `after` (from a
 * previous page's `next` or an item's `cursor`): at most `limit`, in {@link listParked}'s
 * order. Keyset pages: a message replayed or purged between two pages neither shifts the
 * rest nor makes one show twice, so a walk over every page shows each message that stayed
 * parked exactly once (a message parked again after a replay is a new parking, shown again
 * at its new place; a transport's order holds only within the dead letters it reads, see
 * `TRANSPORT_READ_LIMIT`). The `courier dead list` command and the console's failed-messages
 * list both read through this.
 */
export async function listParkedPage(places: ParkingPlaces, filter: ParkedFilter, options: { readonly after?: string; readonly limit: number }): Promise<ParkedPage> {
  const after = options.after === undefined ? undefined : parseCursor(options.after);
  const transportRead = new Map<string, number>();
  const found = await walkParked(places, filter, after, options.limit + 1, transportRead);
  const items = found.slice(0, options.limit);
  const last = items[items.length - 1];
  if (found.length > options.limit && last?.cursor === undefined) throw new UsageError("the inbox store gives its parked heads no seq, so this listing cannot be paged: narrow it with --source or --consumer, or raise --limit");
  return { items, transportRead, next: found.length > options.limit ? last!.cursor! : null };
}

/**
 * How many parked messages `filter` matches in all, when the places can say without reading
 * them: the outbox's dead count (`stats().dead`), the inbox store's `countParked` and the
 * broker's depth (`deadLetters.count`). Null when a filter narrows by what only a read can
 * tell (topic, type, code, age, group) or a place has no count: then the listing says only how many it
 * shows and that more follow, never a guessed total.
 */
export async function countParked(places: ParkingPlaces, filter: ParkedFilter): Promise<number | null> {
  if (filter.topic !== undefined || filter.type !== undefined || filter.code !== undefined || filter.olderThanMs !== undefined || filter.group !== undefined) return null;
  const source = filter.source ?? 'all';
  let total = 0;
  if ((source === 'all' || source === 'outbox') && places.outbox && filter.consumer === undefined) total += (await places.outbox.stats()).dead;
  if ((source === 'all' || source === 'inbox') && places.inbox) {
    if (!places.inbox.countParked) return null;
    total += await places.inbox.countParked(filter.consumer !== undefined ? { consumer: filter.consumer } : {});
  }
  if ((source === 'all' || source === 'transport') && places.deadLetters) {
    const count = places.deadLetters.count?.bind(places.deadLetters);
    if (!count) return null;
    for (const consumer of filter.consumer !== undefined ? [filter.consumer] : places.consumers) total += await count(consumer);
  }
  return total;
}

/**
 * Lists parked messages matching `filter`: outbox rows first (by sequence), then consumers'
 * parked heads (in the order they were parked), then each consumer's transport dead letters
 * (by deadAt, then id; at most {@link TRANSPORT_READ_LIMIT} read per consumer). Each item
 * carries its `cursor`. `reads`, when given, receives per consumer how many transport dead
 * letters were read (what {@link unreadTransportLetters} compares with the broker's count).
 */
export async function listParked(places: ParkingPlaces, filter: ParkedFilter, limit: number, reads?: Map<string, number>): Promise<ParkedMessage[]> {
  return walkParked(places, filter, undefined, limit, reads);
}

async function walkParked(places: ParkingPlaces, filter: ParkedFilter, from: Position | undefined, limit: number, reads?: Map<string, number>): Promise<ParkedMessage[]> {
  const found: ParkedMessage[] = [];
  const source = filter.source ?? 'all';
  const reached = (part: Position['part']): boolean => from === undefined || PART_ORDER[from.part] <= PART_ORDER[part];
  if ((source === 'all' || source === 'outbox') && places.outbox && filter.consumer === undefined && reached('outbox')) {
    let after: bigint | undefined = from?.part === 'outbox' ? from.seq : undefined;
    for (;;) {
      const page = await places.outbox.listDead({ limit: PAGE, ...(after !== undefined ? { after } : {}), ...(filter.topic !== undefined ? { topic: filter.topic } : {}) });
      for (const row of page) {
        const item: ParkedMessage = {
          ref: `outbox:${row.sequence}`,
          source: 'outbox',
          state: row.state,
          consumer: null,
          envelope: row.envelope,
          code: row.code ?? legacyOutboxCode(row.lastError),
          errorName: row.errorName,
          firstFailedAt: row.firstFailedAt,
          error: row.lastError,
          attempts: row.attempts,
          parkedAt: row.failedAt,
          cursor: encodeCursor({ part: 'outbox', seq: row.sequence }),
        };
        if (matches(item, filter)) found.push(item);
        if (found.length >= limit) return found;
      }
      if (page.length < PAGE) break;
      after = page[page.length - 1]!.sequence;
    }
  }
  if ((source === 'all' || source === 'inbox') && places.inbox && reached('inbox')) {
    const consumer = filter.consumer !== undefined ? { consumer: filter.consumer } : {};
    let after: bigint | undefined = from?.part === 'inbox' ? from.seq : undefined;
    for (;;) {
      const page = await places.inbox.listParked({ ...consumer, limit: PAGE, ...(after !== undefined ? { after } : {}) });
      // A store without `seq` cannot be paged: one bounded read, as before paging existed.
      const heads = page.length > 0 && page[0]!.seq === undefined ? await places.inbox.listParked({ ...consumer, limit: PARKED_READ_LIMIT }) : page;
      for (const head of heads) {
        const item = parkedHead(head.consumer, head.envelope, head.error, head.parkedAt, head.seq);
        if (matches(item, filter)) found.push(item);
        if (found.length >= limit) return found;
      }
      if (heads !== page || page.length < PAGE) break;
      after = page[page.length - 1]!.seq!;
    }
  }
  if ((source === 'all' || source === 'transport') && places.deadLetters && reached('transport')) {
    const consumers = filter.consumer !== undefined ? [filter.consumer] : places.consumers;
    let start = 0;
    if (from?.part === 'transport') {
      start = consumers.indexOf(from.consumer);
      if (start < 0) throw new UsageError(`--after: the cursor is at consumer '${from.consumer}', which this listing does not cover (take the cursor with the same --consumer and config)`);
    }
    await requireDeadLetterPlaces(places.deadLetters, consumers.slice(start));
    for (const consumer of consumers.slice(start)) {
      const read = await places.deadLetters.list(consumer, { limit: TRANSPORT_READ_LIMIT });
      reads?.set(consumer, read.length);
      const letters = [...read].sort((a, b) => a.deadAt.getTime() - b.deadAt.getTime() || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
      for (const letter of letters) {
        if (from?.part === 'transport' && from.consumer === consumer && (letter.deadAt.getTime() < from.deadAtMs || (letter.deadAt.getTime() === from.deadAtMs && letter.id <= from.id))) continue;
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
          cursor: encodeCursor({ part: 'transport', consumer, deadAtMs: letter.deadAt.getTime(), id: letter.id }),
        };
        if (matches(item, filter)) found.push(item);
        if (found.length >= limit) return found;
      }
    }
  }
  return found;
}

/**
 * The code of an outbox row dead-lettered before the store kept codes (schema < 5): the relay
 * wrote `describeError`'s `Name [CODE]: message`, so only a code in that position counts, not
 * a bracketed word inside a broker's message.
 */
function legacyOutboxCode(lastError: string | null): string | null {
  return /^[A-Za-z_$][\w$]* \[([A-Z][A-Z0-9_]*)\]: /.exec(lastError ?? '')?.[1] ?? null;
}

/** A parked consumer head as a {@link ParkedMessage}; its error is `<CODE>: <message>` as the consumer stores it. */
function parkedHead(consumer: string, envelope: Envelope, error: string, parkedAt: Date, seq: bigint | undefined): ParkedMessage {
  const coded = /^([A-Z][A-Z0-9_]*): ([\s\S]*)$/.exec(error);
  return {
    ref: `parked:${consumer}:${envelope.messageId}`,
    source: 'inbox',
    state: 'parked',
    consumer,
    envelope,
    code: coded?.[1] ?? null,
    error: coded ? coded[2]! : error,
    attempts: null,
    parkedAt,
    ...(seq !== undefined ? { cursor: encodeCursor({ part: 'inbox', seq }) } : {}),
  };
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
export type ParkedRef =
  | { readonly source: 'outbox'; readonly sequence: bigint }
  | { readonly source: 'inbox'; readonly consumer: string; readonly messageId: string }
  | { readonly source: 'transport'; readonly consumer: string; readonly id: string };

/** Parses `outbox:<sequence>`, `parked:<consumer>:<messageId>` or `dlq:<consumer>:<id>`; throws a `UsageError` naming the bad one. */
export function parseRef(ref: string): ParkedRef {
  const outbox = /^outbox:(\d+)$/.exec(ref);
  if (outbox) return { source: 'outbox', sequence: BigInt(outbox[1]!) };
  const parked = /^parked:([^:]+):(.+)$/.exec(ref);
  if (parked) return { source: 'inbox', consumer: parked[1]!, messageId: parked[2]! };
  const dlq = /^dlq:([^:]+):(.+)$/.exec(ref);
  if (dlq) return { source: 'transport', consumer: dlq[1]!, id: dlq[2]! };
  throw new UsageError(`'${ref}' is not a dead letter reference (write outbox:<sequence>, parked:<consumer>:<messageId> or dlq:<consumer>:<id>, as \`courier dead list\` prints them)`);
}

/**
 * What {@link actOnParked} changed, per place (a place reports fewer than it was given when
 * some were already gone: another operator, a relay). `heldBehind` lists the replayed
 * parked heads whose key was halted again meanwhile: they wait behind that halt.
 */
export interface ParkedActionResult {
  readonly outbox: number;
  readonly transport: number;
  readonly inbox: number;
  readonly heldBehind: readonly ParkedMessage[];
}

/**
 * Replays (`action` replay) or purges parked messages: outbox rows through the outbox's
 * `replay`/`purge`, consumers' parked heads through the inbox store's `replayParked` /
 * `purgeParked` (a replayed head becomes the head of a resumed halt of its key, which a
 * running instance of its consumer drains: it runs once), transport dead letters through
 * `deadLetters` per consumer.
 */
export async function actOnParked(places: ParkingPlaces, items: readonly ParkedMessage[], action: 'replay' | 'purge'): Promise<ParkedActionResult> {
  const sequences: bigint[] = [];
  const byConsumer = new Map<string, string[]>();
  const heads: { item: ParkedMessage; consumer: string; messageId: string }[] = [];
  for (const item of items) {
    const ref = parseRef(item.ref);
    if (ref.source === 'outbox') sequences.push(ref.sequence);
    else if (ref.source === 'inbox') heads.push({ item, consumer: ref.consumer, messageId: ref.messageId });
    else byConsumer.set(ref.consumer, [...(byConsumer.get(ref.consumer) ?? []), ref.id]);
  }
  if (heads.length > 0 && !places.inbox) throw new UsageError('the config has no inbox store with halts, so parked consumer heads cannot be changed');
  let outbox = 0;
  let transport = 0;
  let inbox = 0;
  const heldBehind: ParkedMessage[] = [];
  for (const { item, consumer, messageId } of heads) {
    if (action === 'purge') {
      if (await places.inbox!.purgeParked(consumer, messageId)) inbox += 1;
      continue;
    }
    const outcome = await places.inbox!.replayParked(consumer, messageId);
    if (outcome !== false) inbox += 1;
    if (outcome === 'held') heldBehind.push(item);
  }
  if (sequences.length > 0) {
    if (!places.outbox) throw new UsageError('the config has no outbox, so outbox dead rows cannot be changed');
    outbox = action === 'replay' ? await places.outbox.replay(sequences) : await places.outbox.purge(sequences);
  }
  for (const [consumer, ids] of byConsumer) {
    if (!places.deadLetters) throw new UsageError('the config has no transport with dead letters (`transport.deadLetters`)');
    transport += action === 'replay' ? await places.deadLetters.replay(consumer, ids) : await places.deadLetters.purge(consumer, ids);
  }
  return { outbox, transport, inbox, heldBehind };
}

/** Finds the parked messages named by `refs` (each must exist), for show, replay and purge by reference. */
export async function findParked(places: ParkingPlaces, refs: readonly string[]): Promise<ParkedMessage[]> {
  const wanted = refs.map(parseRef);
  const all = await listParked(places, {}, Number.MAX_SAFE_INTEGER);
  const byRef = new Map(all.map((item) => [item.ref, item]));
  // Consumers not in the config's list are looked up too: a reference may name any (the
  // inbox store lists every consumer's parked heads, so only the transport needs this).
  for (const ref of wanted) {
    if (ref.source === 'transport' && !places.consumers.includes(ref.consumer) && places.deadLetters) {
      for (const item of await listParked({ ...places, consumers: [ref.consumer] }, { source: 'transport' }, Number.MAX_SAFE_INTEGER)) byRef.set(item.ref, item);
    }
  }
  const missing = refs.filter((ref) => !byRef.has(ref));
  if (missing.length > 0) throw new NotFoundError(`no dead letter ${missing.map((ref) => `'${ref}'`).join(', ')} (list them with \`courier dead list\`)`);
  return refs.map((ref) => byRef.get(ref)!);
}

/**
 * Fails (exit 1) naming every consumer whose dead-letter place the broker does not have,
 * when the transport can tell (`TransportDeadLetters.exists`): a mistyped prefix or consumer
 * name otherwise reads as "no dead letters", exit 0, and an operator concludes all is well.
 */
export async function requireDeadLetterPlaces(deadLetters: Pick<TransportDeadLetters, 'exists'>, consumers: readonly string[]): Promise<void> {
  if (!deadLetters.exists) return;
  const missing: string[] = [];
  for (const consumer of consumers) if (!(await deadLetters.exists(consumer))) missing.push(consumer);
  if (missing.length === 0) return;
  throw new NotFoundError(
    `no such dead-letter queue on the broker for consumer ${missing.map((name) => `'${name}'`).join(', ')} (nothing was created): check the prefix of the config's transport and the consumer names (\`consumers\` in the config, --consumer); a consumer that never subscribed has none yet`,
  );
}

/** A referenced dead letter or halted key does not exist (exit code 1). */
export class NotFoundError extends Error {
  override readonly name = 'NotFoundError';
}
