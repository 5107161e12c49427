// A consumer's dead letters: written by a subscription to a stream of their own (one subject
// per consumer), read, replayed and purged by operators. Apart from the subscription so the
// operator side needs no live subscription, and so both sides agree on one header format.
import { TransportError, type DeadLetter, type DeadLetterReason, type Envelope, type TransportDeadLetters } from '@courier/core';
import type { JsMsg } from '@nats-io/jetstream';
import { headers as natsHeaders } from '@nats-io/transport-node';
import { DEAD_HEADER, MAX_HEADER_BYTES, PAYLOAD_MARGIN, REPLAYED_HEADER, decode, describe, encode, hash, headerBytes } from './nats-mapping.js';
import type { Connection, JetStreamNames } from './topology.js';

/**
 * What the operator side needs of the transport: its connection (opened on demand, declaring
 * no stream: operator commands create nothing) and names.
 */
export interface DeadLetterSource {
  connection(): Promise<Connection>;
  readonly names: JetStreamNames;
}

/**
 * The transport's `deadLetters`: `list` reads the dead-letter stream without taking anything
 * from it; `replay` publishes a copy marked replayed to the consumer's own subject, then
 * deletes the dead letter; `exists` says whether the consumer ever subscribed under this
 * prefix (its durable on its own subject, which `subscribe` always declares), so a mistyped
 * prefix or consumer name is "no such dead-letter place", not an empty list. Nothing is
 * declared by any of them.
 */
export function jetStreamDeadLetters(source: DeadLetterSource): TransportDeadLetters {
  return {
    exists: (consumer) => consumerExists(source, consumer),
    list: (consumer, listOptions) => listDead(source, consumer, listOptions?.limit ?? 100),
    replay: (consumer, ids) => replayDead(source, consumer, ids),
    purge: (consumer, ids) => purgeDead(source, consumer, ids),
  };
}

/**
 * The consumer group's lag: `num_pending` (messages matching its filter not yet delivered to
 * it) summed over its durables — one per topic (found by their filter subject
 * `<prefix>.t.<topic>` and name) and the one on its own subject (retry copies, replays).
 * Read from the consumers' info: nothing delivered, acknowledged or declared. Null when the
 * consumer never subscribed under this prefix (no durable on its own subject).
 */
export async function consumerLag(source: DeadLetterSource, consumer: string): Promise<number | null> {
  if (!(await consumerExists(source, consumer))) return null;
  const connection = await source.connection();
  const { names } = source;
  const topicPrefix = `${names.prefix}.t.`;
  const own = names.durable(consumer, 'c');
  let pending = 0;
  try {
    for await (const info of connection.jsm.consumers.list(names.stream)) {
      const subject = info.config.filter_subject ?? '';
      const mine = info.name === own || (subject.startsWith(topicPrefix) && info.name === names.durable(consumer, `t:${subject.slice(topicPrefix.length)}`));
      if (mine) pending += info.num_pending;
    }
  } catch (error) {
    throw new TransportError(`could not read the lag of consumer '${consumer}': ${describe(error)}`, { cause: error });
  }
  return pending;
}

async function consumerExists(source: DeadLetterSource, consumer: string): Promise<boolean> {
  const connection = await source.connection();
  const { names } = source;
  try {
    await connection.jsm.consumers.info(names.stream, names.durable(consumer, 'c'));
    return true;
  } catch (error) {
    // "consumer not found", or "stream not found": nothing ever subscribed under the prefix.
    if (/not found/i.test(describe(error))) return false;
    throw new TransportError(`could not look up consumer '${consumer}': ${describe(error)}`, { cause: error });
  }
}

async function listDead(source: DeadLetterSource, consumer: string, limit: number): Promise<readonly DeadLetter[]> {
  const connection = await source.connection();
  const { names } = source;
  const subject = names.deadSubject(consumer);
  const found: DeadLetter[] = [];
  let seq = 1;
  while (found.length < limit) {
    const stored = await connection.jsm.streams.getMessage(names.deadStream, { seq, next_by_subj: subject } as never).catch((error: unknown) => {
      // Past the last one ("no message found"), or no dead-letter stream at all ("stream not found":
      // nothing was published under the prefix, and reads do not declare it): nothing more to list.
      if (/no message found|not found/i.test(describe(error))) return null;
      throw new TransportError(`could not list dead letters of '${consumer}': ${describe(error)}`, { cause: error });
    });
    if (!stored) break;
    seq = stored.seq + 1;
    try {
      const dead = JSON.parse(stored.header.get(DEAD_HEADER)) as { reason: DeadLetterReason; attempt: number; deadAt: string };
      found.push({ id: String(stored.seq), consumer, envelope: decode(stored.header, stored.data), reason: dead.reason, attempt: dead.attempt, deadAt: new Date(dead.deadAt) });
    } catch {
      // An undecodable message dead-lettered as ENVELOPE_INVALID has no envelope to show; operators see it with the nats CLI.
    }
  }
  return found;
}

async function replayDead(source: DeadLetterSource, consumer: string, ids: readonly string[]): Promise<number> {
  const connection = await source.connection();
  const { names } = source;
  let count = 0;
  for (const id of ids) {
    const stored = await connection.jsm.streams.getMessage(names.deadStream, { seq: Number(id) }).catch(() => null);
    if (!stored || stored.subject !== names.deadSubject(consumer)) continue;
    const envelope = decode(stored.header, stored.data);
    const { headers, data } = encode(envelope, { [REPLAYED_HEADER]: '1' });
    await connection.js.publish(names.consumerSubject(consumer), data, { msgID: `${envelope.messageId}~replay~${hash(consumer)}~${id}`, headers });
    await connection.jsm.streams.deleteMessage(names.deadStream, stored.seq, false).catch(() => false);
    count += 1;
  }
  return count;
}

async function purgeDead(source: DeadLetterSource, consumer: string, ids: readonly string[]): Promise<number> {
  const connection = await source.connection();
  const { names } = source;
  let count = 0;
  for (const id of ids) {
    const stored = await connection.jsm.streams.getMessage(names.deadStream, { seq: Number(id) }).catch(() => null);
    if (!stored || stored.subject !== names.deadSubject(consumer)) continue;
    if (await connection.jsm.streams.deleteMessage(names.deadStream, stored.seq, false).catch(() => false)) count += 1;
  }
  return count;
}

// ------------------------------------------------------------------ close


/**
 * Writes `msg` to the consumer's dead letters with its reason (the caller acknowledges it
 * after). The copy always fits the server's `max_payload` and JetStream's header bound when the
 * message did: its `Nats-*`
 * headers (server directives for the original publish, such as `Nats-Expected-Stream`,
 * which the DLQ stream would refuse) are dropped and the reason's message is cut to the
 * room left (see `deadLetterHeader`).
 */
export async function writeDeadLetter(
  connection: Connection,
  names: JetStreamNames,
  consumer: string,
  msg: JsMsg,
  envelope: Envelope | undefined,
  attempt: number,
  reason: DeadLetterReason,
): Promise<void> {
  const headers = natsHeaders();
  if (msg.headers) for (const [name, values] of msg.headers) if (!/^nats-/i.test(name)) for (const value of values) headers.append(name, value);
  const maxPayload = connection.nc.info?.max_payload ?? 1024 * 1024;
  // Two bounds: the whole message within the connection's max_payload, the headers within what JetStream stores.
  const room =
    Math.min(maxPayload - msg.data.byteLength - PAYLOAD_MARGIN, MAX_HEADER_BYTES - 64) - headerBytes(headers) - Buffer.byteLength(DEAD_HEADER) - 4;
  headers.set(DEAD_HEADER, deadLetterHeader({ reason, attempt, deadAt: new Date().toISOString(), consumer }, room));
  try {
    await connection.js.publish(names.deadSubject(consumer), msg.data, { msgID: `${hash(consumer)}~${msg.seq}`, headers });
  } catch (error) {
    throw new TransportError(`could not dead-letter '${envelope?.messageId ?? msg.seq}': ${describe(error)}`, { cause: error, retriable: true });
  }
}


/**
 * The `Courier-Dead` header value of a dead letter: its reason, attempt, time and consumer as
 * JSON, in at most `room` bytes. A reason whose message does not fit (a handler's error can
 * quote a whole payload) is cut at a character boundary and says how long it was; the code
 * and the other fields are kept whole. Past them nothing is cut: the publish then fails,
 * and the message comes back.
 */
export function deadLetterHeader(dead: { reason: DeadLetterReason; attempt: number; deadAt: string; consumer: string }, room: number): string {
  const render = (message: string) => JSON.stringify({ reason: { code: dead.reason.code, message }, attempt: dead.attempt, deadAt: dead.deadAt, consumer: dead.consumer });
  const whole = render(dead.reason.message);
  if (Buffer.byteLength(whole) <= room) return whole;
  const { message } = dead.reason;
  const cut = (length: number) => {
    // Never between the two halves of a surrogate pair.
    const end = length > 0 && /[\uD800-\uDBFF]/.test(message[length - 1]!) ? length - 1 : length;
    return `${message.slice(0, end)}… (cut; ${Buffer.byteLength(message)} bytes in all)`;
  };
  // The longest prefix that fits: JSON escapes make a character cost 1 to 6 bytes, so search.
  let low = 0;
  let high = message.length;
  while (low < high) {
    const middle = Math.ceil((low + high) / 2);
    if (Buffer.byteLength(render(cut(middle))) <= room) low = middle;
    else high = middle - 1;
  }
  return render(cut(low));
}
