/**
 * What the Kafka transport's parts share: the names Kafka accepts, how a kafkajs error is read,
 * and the bounded wait every broker call goes through (a broker that accepts the connection and
 * never answers would otherwise hold a call for ever).
 */
export const NAME_PATTERN = /^[A-Za-z0-9._-]*$/;
export const TOPIC_MAX = 249;
export const RETRY_INFIX = 'courier-retry.';
export const DLT_INFIX = 'courier-dlt.';
/** Protocol errors that refuse a record for its content: retrying the same record never helps. */
export const CONTENT_ERRORS = new Set(['MESSAGE_TOO_LARGE', 'RECORD_LIST_TOO_LARGE', 'INVALID_RECORD', 'CORRUPT_MESSAGE', 'POLICY_VIOLATION', 'INVALID_TIMESTAMP', 'INVALID_TOPIC_EXCEPTION']);
/**
 * Protocol errors a partition answers while its leader is being elected or loaded (a topic
 * created a moment ago; kafkajs names code 6 NOT_LEADER_FOR_PARTITION, Kafka NOT_LEADER_OR_FOLLOWER).
 */
export const LEADER_NOT_READY = new Set(['NOT_LEADER_FOR_PARTITION', 'LEADER_NOT_AVAILABLE', 'UNKNOWN_TOPIC_OR_PARTITION', 'REPLICA_NOT_AVAILABLE']);


export const describe = (error: unknown): string => (error instanceof Error ? `${error.name}: ${error.message}` : String(error));

/** The Kafka protocol error type (`MESSAGE_TOO_LARGE`, ...) somewhere in a kafkajs error's causes. */
export function protocolType(error: unknown, depth = 0): string | undefined {
  if (!error || typeof error !== 'object' || depth > 5) return undefined;
  const record = error as { type?: unknown; originalError?: unknown; cause?: unknown; errors?: unknown };
  if (typeof record.type === 'string') return record.type;
  for (const next of [record.originalError, record.cause, ...(Array.isArray(record.errors) ? record.errors : [])]) {
    const found = protocolType(next, depth + 1);
    if (found) return found;
  }
  return undefined;
}

export class Timeout extends Error {}

export function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Timeout(`${what} did not finish within ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}


export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
