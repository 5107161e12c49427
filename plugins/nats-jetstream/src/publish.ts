// The publish path: every message checked before it is sent (what NATS would refuse, what
// would not fit), then sent with a PubAck awaited per message, a bounded number in flight.
// Apart from the transport, which only decides whether a call may start (closed, aborted,
// no connection).
import { SerializationError, TransportError, payloadBytes, type Envelope, type PublishResult } from '@courier/core';
import { COPY_HEADER_RESERVE, ENVELOPE_HEADER, MAX_HEADER_BYTES, MSG_ID_HEADER, PAYLOAD_MARGIN, encode, headerBytes, publishError } from './nats-mapping.js';
import type { Connection, JetStreamNames } from './topology.js';

/**
 * Lists what makes NATS refuse `envelope` whatever its state: a topic with an empty subject
 * token, and envelope fields whose encoded headers leave JetStream's 64 KiB header bound
 * too little room for a retry copy's or dead letter's own (so it could be published but
 * never retried or dead-lettered).
 */
export function envelopeProblems(envelope: Envelope): readonly string[] {
  const problems: string[] = [];
  if (envelope.topic.split('.').some((token) => token === '')) {
    problems.push(`topic '${envelope.topic}' has an empty token ('..', or a leading or trailing '.'), which a NATS subject cannot hold`);
  }
  const { payload: _payload, ...meta } = envelope;
  const bytes = 12 + Buffer.byteLength(ENVELOPE_HEADER) + 4 + Buffer.byteLength(JSON.stringify(meta));
  if (bytes > MAX_HEADER_BYTES - COPY_HEADER_RESERVE) {
    problems.push(
      `envelope '${envelope.messageId}' encodes to ${bytes} bytes of NATS headers; JetStream stores at most ${MAX_HEADER_BYTES}, of which ${COPY_HEADER_RESERVE} are kept for a retry copy's or dead letter's own (shorten its headers)`,
    );
  }
  return problems;
}

/** What {@link publishEnvelopes} needs of the transport's settings. */
export interface PublishSettings {
  readonly names: JetStreamNames;
  readonly maxMessageBytes: number;
  readonly publishTimeoutMs: number;
  readonly publishHeaders?: ((envelope: Envelope) => Readonly<Record<string, string>> | undefined) | undefined;
}

/**
 * Publishes `messages` on `connection` in order and answers one result per message, once
 * each has its PubAck or failed; rejects with a retriable `TransportError` when nothing was
 * acknowledged, every message failed for connectivity and the connection is down (the
 * transport as a whole was unavailable). `signal` aborting mid-call makes the messages not
 * yet sent `ABORTED` results.
 */
export async function publishEnvelopes(connection: Connection, messages: readonly Envelope[], signal: AbortSignal | undefined, settings: PublishSettings): Promise<readonly PublishResult[]> {
  const maxPayload = connection.nc.info?.max_payload ?? 1024 * 1024;
  const results: Promise<PublishResult>[] = [];
  const window: Promise<unknown>[] = [];
  for (const envelope of messages) {
    const { messageId } = envelope;
    if (signal?.aborted) {
      results.push(Promise.resolve({ messageId, ok: false, error: new TransportError('publish aborted', { code: 'ABORTED', retriable: true }) }));
      continue;
    }
    if (!connection.connected) {
      results.push(Promise.resolve({ messageId, ok: false, error: new TransportError('nats connection lost before this message was sent', { retriable: true }) }));
      continue;
    }
    const problems = envelopeProblems(envelope);
    if (problems.length > 0) {
      results.push(Promise.resolve({ messageId, ok: false, error: new SerializationError('MESSAGE_INVALID', problems.join('; ')) }));
      continue;
    }
    if (payloadBytes(envelope) > settings.maxMessageBytes) {
      results.push(
        Promise.resolve({ messageId, ok: false, error: new SerializationError('PAYLOAD_TOO_LARGE', `payload of '${messageId}' is over ${settings.maxMessageBytes} bytes`) }),
      );
      continue;
    }
    const extra = settings.publishHeaders?.(envelope);
    const { headers, data } = encode(envelope, {});
    let msgID = messageId;
    for (const [name, value] of Object.entries(extra ?? {})) {
      if (name === MSG_ID_HEADER) msgID = value;
      else headers.set(name, value);
    }
    if (data.byteLength + headerBytes(headers) + PAYLOAD_MARGIN > maxPayload) {
      results.push(
        Promise.resolve({ messageId, ok: false, error: new SerializationError('PAYLOAD_TOO_LARGE', `message '${messageId}' with its headers is over the server's max_payload of ${maxPayload} bytes`) }),
      );
      continue;
    }
    const sent = connection.js.publish(settings.names.topicSubject(envelope.topic), data, { msgID, headers, timeout: settings.publishTimeoutMs }).then(
      (): PublishResult => ({ messageId, ok: true }),
      (error: unknown): PublishResult => ({ messageId, ok: false, error: publishError(error, messageId) }),
    );
    results.push(sent);
    window.push(sent);
    // Bound the PubAcks in flight; the signal is checked again after each wait.
    if (window.length >= 256) await window.shift();
  }
  const settled = await Promise.all(results);
  // Messages written while the client was reconnecting never reached the server: when
  // nothing was answered and every message failed for connectivity, the transport as a
  // whole was unavailable, and the call rejects (the relay pauses without an attempt).
  const sent = settled.filter((result) => result.ok || !['ABORTED', 'PAYLOAD_TOO_LARGE', 'MESSAGE_INVALID'].includes(result.error.code));
  if (sent.length > 0 && sent.every((result) => !result.ok && (result.error.code === 'TRANSPORT' || result.error.code === 'PUBLISH_TIMEOUT')) && !connection.connected) {
    throw new TransportError('nats connection is down; nothing was acknowledged', { retriable: true, cause: (sent[0] as { error?: unknown }).error });
  }
  return settled;
}

