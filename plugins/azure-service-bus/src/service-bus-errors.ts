import { CourierError, SerializationError, TransportError } from '@courier/core';
import { isServiceBusError } from '@azure/service-bus';

/** The application properties that carry the envelope's fields and Courier's own marks on a Service Bus message. */
export const P = {
  version: 'courier-version',
  topic: 'courier-topic',
  occurredAt: 'courier-occurred-at',
  key: 'courier-key',
  causationId: 'courier-causation-id',
  traceparent: 'traceparent',
  tracestate: 'tracestate',
  headers: 'courier-headers',
  messageId: 'courier-message-id',
  attempt: 'courier-attempt',
  replayedFor: 'courier-replayed-for',
  deadAt: 'courier-dead-at',
  /** The consumer (group) that dead-lettered the message: a queue's dead letters are shared by all its receivers. */
  deadFor: 'courier-dead-for',
} as const;

/** ServiceBusError codes that mean the namespace or the connection, not the message: the relay pauses. */
export const CONNECTIVITY = new Set(['ServiceBusy', 'ServiceCommunicationProblem', 'ServiceTimeout']);
export const NAME_PATTERN = /^[A-Za-z0-9._-]{0,100}$/;

export const describe = (error: unknown): string => (error instanceof Error ? error.message : String(error));
export const codeOf = (error: unknown): string | undefined => (isServiceBusError(error) ? error.code : (error as { code?: string } | undefined)?.code);
/**
 * A ServiceBusError (or any error of a send) as a transport error: `ServiceBusy` and the
 * connection codes are retriable connectivity (`TRANSPORT`: the relay pauses without
 * counting attempts); `MessageSizeExceeded` is `PAYLOAD_TOO_LARGE`; the rest are
 * `PUBLISH_REJECTED`, retriable only when the SDK says the error is.
 */
export function toTransportError(caught: unknown, what: string): CourierError {
  if (caught instanceof CourierError) return caught;
  // After its own retries the SDK throws an AggregateError of the attempts: the last one says why.
  const error = caught instanceof AggregateError && caught.errors.length > 0 ? caught.errors[caught.errors.length - 1] : caught;
  const code = codeOf(error);
  const message = `${what}: ${code ? `[${code}] ` : ''}${describe(error)}`;
  if (code === 'MessageSizeExceeded') return new SerializationError('PAYLOAD_TOO_LARGE', message, { cause: caught });
  if (code !== undefined && CONNECTIVITY.has(code)) return new TransportError(message, { cause: error });
  // The SDK reports socket failures (refused, reset) as GeneralError: the connection, not the message.
  if (code === 'GeneralError' && /ECONN|EPIPE|socket|disconnect|connection/i.test(describe(error))) return new TransportError(message, { cause: error });
  if (isServiceBusError(error)) return new TransportError(message, { code: 'PUBLISH_REJECTED', retriable: error.retryable, cause: error });
  // Not a ServiceBusError: a socket or AMQP-level failure of the connection.
  return new TransportError(message, { cause: error });
}

/** Whether a transport error is about the connection (the relay pauses) rather than the message. */
export const isConnectivity = (error: CourierError): boolean => error.code === 'TRANSPORT' || error.code === 'PUBLISH_TIMEOUT' || error.code === 'CLOSED';
