// How a Courier envelope travels on NATS, and the bounds that shape it: the envelope's
// fields in one JSON header beside the payload as the body, and the room the server leaves
// for headers. Kept apart from the transport so the publish path, the subscription and the
// dead letters encode, decode and size messages the same way.
import { createHash } from 'node:crypto';
import { CourierError, SerializationError, TransportError, decodeEnvelope, type Envelope } from '@courier/core';
import { headers as natsHeaders, type MsgHdrs } from '@nats-io/transport-node';

export const ENVELOPE_HEADER = 'Courier-Envelope';
export const ATTEMPT_HEADER = 'Courier-Attempt';
export const NOT_BEFORE_HEADER = 'Courier-Not-Before';
export const REPLAYED_HEADER = 'Courier-Replayed';
export const DEAD_HEADER = 'Courier-Dead';
export const MSG_ID_HEADER = 'Nats-Msg-Id';
/**
 * Room kept for the encoded headers inside the server's 1 MiB `max_payload`; far more than
 * JetStream stores ({@link MAX_HEADER_BYTES}), so a payload of `maxMessageBytes` always fits
 * with its headers, those a retry copy or dead letter adds included. `publish` still checks
 * each message against the server's actual `max_payload` (a server may lower it).
 */
export const HEADER_ROOM = 512 * 1024;
/** nats-server stores no message whose header block is over 64 KiB ("header size exceeds maximum allowed of 64k"). */
export const MAX_HEADER_BYTES = 64 * 1024 - 1;
/**
 * Of {@link MAX_HEADER_BYTES}, what a message's own headers must leave for those its retry
 * copy or dead letter adds: `validate` refuses an envelope that leaves less. A dead letter's
 * reason is cut to what is left (`deadLetterHeader`), so a message that was published can
 * always be dead-lettered.
 */
export const COPY_HEADER_RESERVE = 4 * 1024;
/**
 * Bytes `publish` leaves free under `max_payload` beyond a message's own headers: room for
 * what a retry copy adds (`Courier-Attempt`, `Courier-Not-Before`, `Courier-Replayed`), so a
 * message that was published can always be retried; kept again when a dead letter is sized.
 */
export const PAYLOAD_MARGIN = 512;

/** A short, stable token of a consumer name for subjects and durable names (any text is allowed in a consumer name, not in a subject). */
export const hash = (value: string): string => createHash('sha256').update(value).digest('hex').slice(0, 20);
/** A thrown value's text, for error messages and the client's error matching. */
export const describe = (error: unknown): string => (error instanceof Error ? error.message : String(error));
/** Whether a client error means the server could not be reached (retry later), not that it refused. */
export const isConnectivity = (error: unknown): boolean => {
  const text = `${(error as { code?: unknown })?.code ?? ''} ${describe(error)}`.toLowerCase();
  return /timeout|disconnect|closed|connection|no responders|503|econn|reconnect/.test(text);
};

/** The NATS message of `envelope`: its fields but the payload as JSON in `Courier-Envelope`, `extra` headers beside, the payload as the body. */
export function encode(envelope: Envelope, extra: Record<string, string>): { headers: MsgHdrs; data: Uint8Array } {
  const headers = natsHeaders();
  const { payload, ...meta } = envelope;
  headers.set(ENVELOPE_HEADER, JSON.stringify(meta));
  for (const [name, value] of Object.entries(extra)) headers.set(name, value);
  return { headers, data: new TextEncoder().encode(payload) };
}

/** The envelope of a NATS message; throws `SerializationError` (`ENVELOPE_INVALID`) for one that is not a Courier envelope. */
export function decode(headers: MsgHdrs | undefined, data: Uint8Array): Envelope {
  const meta = headers?.get(ENVELOPE_HEADER);
  if (!meta) throw new SerializationError('ENVELOPE_INVALID', `message has no '${ENVELOPE_HEADER}' header`);
  let parsed: unknown;
  try {
    parsed = JSON.parse(meta);
  } catch (error) {
    throw new SerializationError('ENVELOPE_INVALID', `'${ENVELOPE_HEADER}' is not JSON`, { cause: error });
  }
  const payload = new TextDecoder('utf-8', { fatal: true }).decode(data);
  return decodeEnvelope({ ...(parsed as object), payload });
}


/** Bytes `headers` take in a NATS message (the `NATS/1.0` line and each `name: value`), to size a message before the server refuses it. */
export function headerBytes(headers: MsgHdrs): number {
  let total = 12;
  for (const [name, values] of headers) for (const value of values) total += Buffer.byteLength(name) + Buffer.byteLength(value) + 4;
  return total;
}

/**
 * The per-message error of a failed publish: no PubAck in time and a lost connection are
 * connectivity (the relay pauses, counts no attempt); anything else is the server refusing
 * that message.
 */
export function publishError(error: unknown, messageId: string): CourierError {
  const text = describe(error);
  if (/timeout/i.test(text)) return new TransportError(`no PubAck for '${messageId}' in time: ${text}`, { code: 'PUBLISH_TIMEOUT', cause: error, retriable: true });
  if (/disconnect|closed|connection|reconnect/i.test(text)) return new TransportError(`connection lost after sending '${messageId}': ${text}`, { cause: error, retriable: true });
  return new TransportError(`nats refused '${messageId}': ${text}`, { code: 'PUBLISH_REJECTED', cause: error, retriable: true });
}
