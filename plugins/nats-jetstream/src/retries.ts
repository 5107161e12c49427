// An unordered retry: JetStream has no per-message delay on a stream, so the retry is a
// copy on the consumer's own subject that carries its attempt and the time before which it
// is put back (`Courier-Not-Before`); the subscription naks it until then. On the consumer's
// own subject, a retry reaches only the group that asked for it. (An ordered retry is no
// copy: the message waits in place at the head of its key, see the subscription.)
import { TransportError, type Envelope } from '@courier/core';
import type { JsMsg } from '@nats-io/jetstream';
import { ATTEMPT_HEADER, NOT_BEFORE_HEADER, REPLAYED_HEADER, describe, encode, hash } from './nats-mapping.js';
import type { Connection, JetStreamNames } from './topology.js';

/**
 * Publishes the retry copy of `msg` with `attempt`, due `delayMs` from now (the caller
 * acknowledges the original after). The copy's de-duplication id is the original's stream
 * sequence per consumer: a copy written twice (an answer lost) is stored once.
 */
export async function writeRetryCopy(
  connection: Connection,
  names: JetStreamNames,
  consumer: string,
  msg: JsMsg,
  envelope: Envelope,
  attempt: number,
  delayMs: number,
): Promise<void> {
  // A replay's retries are still the replay: the mark goes along (the consumer records a
  // replay's run under the replay's key; an unmarked copy would be taken for a relay duplicate).
  const replayed: Record<string, string> = msg.headers?.get(REPLAYED_HEADER) === '1' ? { [REPLAYED_HEADER]: '1' } : {};
  const { headers, data } = encode(envelope, { [ATTEMPT_HEADER]: String(attempt), [NOT_BEFORE_HEADER]: String(Date.now() + Math.max(0, delayMs)), ...replayed });
  try {
    await connection.js.publish(names.consumerSubject(consumer), data, { msgID: `${envelope.messageId}~${hash(consumer)}~${msg.seq}`, headers });
  } catch (error) {
    throw new TransportError(`could not publish the retry of '${envelope.messageId}': ${describe(error)}`, { cause: error, retriable: true });
  }
}
