// What the transport declares on the server: the message, dead-letter and lease streams of
// a prefix, and a durable pull consumer per (consumer, source). Names are derived here
// only, so the publish path, the subscriptions and the dead letters cannot disagree on them.
import { AckPolicy, DeliverPolicy, DiscardPolicy, RetentionPolicy, StorageType, type JetStreamClient, type JetStreamManager, type StreamConfig } from '@nats-io/jetstream';
import { TransportError } from '@courier/core';
import type { NatsConnection } from '@nats-io/transport-node';
import { describe, hash, isConnectivity } from './nats-mapping.js';

/** One client connection with its JetStream handles; `connected` follows the client's status events. */
export interface Connection {
  readonly nc: NatsConnection;
  readonly js: JetStreamClient;
  readonly jsm: JetStreamManager;
  connected: boolean;
}

/**
 * The stream, subject and durable names of a prefix. Consumer names are hashed into subjects
 * and durables: a consumer name may hold characters a subject or durable name cannot.
 */
export class JetStreamNames {
  constructor(readonly prefix: string) {}

  /** Every published message (`<prefix>.t.<topic>`) and every retry or replay copy (`<prefix>.c.<consumer hash>`). */
  get stream(): string {
    return `${this.prefix}_MSG`;
  }
  get deadStream(): string {
    return `${this.prefix}_DLQ`;
  }
  /** One message per ordered group: who holds it and until when (see `ordered-lease.ts`). */
  get leaseStream(): string {
    return `${this.prefix}_LEASE`;
  }
  topicSubject(topic: string): string {
    return `${this.prefix}.t.${topic}`;
  }
  /** A consumer's own subject: its retry copies and replays reach it alone, not the topic's other groups. */
  consumerSubject(consumer: string): string {
    return `${this.prefix}.c.${hash(consumer)}`;
  }
  deadSubject(consumer: string): string {
    return `${this.prefix}.dlq.${hash(consumer)}`;
  }
  leaseSubject(consumer: string): string {
    return `${this.prefix}.lease.${hash(consumer)}`;
  }
  durable(consumer: string, source: string): string {
    return `${this.prefix}_${hash(`${consumer}\u0000${source}`)}`;
  }
}

/** Declares the three streams of `names` (idempotent; an existing stream is kept if its subjects cover ours). */
export async function declareStreams(
  connection: Connection,
  names: JetStreamNames,
  options: { readonly duplicateWindowMs: number; readonly stream?: Partial<StreamConfig> | undefined },
): Promise<void> {
  const prefix = names.prefix;
  await ensureStream(connection, {
    name: names.stream,
    subjects: [`${prefix}.t.>`, `${prefix}.c.>`],
    retention: RetentionPolicy.Limits,
    storage: StorageType.File,
    discard: DiscardPolicy.Old,
    duplicate_window: options.duplicateWindowMs * 1_000_000,
    ...options.stream,
  });
  await ensureStream(connection, {
    name: names.deadStream,
    subjects: [`${prefix}.dlq.>`],
    storage: options.stream?.storage ?? StorageType.File,
    duplicate_window: 120_000_000_000,
  });
  await ensureStream(connection, {
    name: names.leaseStream,
    subjects: [`${prefix}.lease.>`],
    storage: StorageType.File,
    max_msgs_per_subject: 1,
  });
}

async function ensureStream(connection: Connection, config: Partial<StreamConfig> & { name: string }): Promise<void> {
  try {
    await connection.jsm.streams.add(config);
  } catch (error) {
    // The stream exists with other settings (or another client's): keep it if its subjects cover ours.
    const info = await connection.jsm.streams.info(config.name).catch(() => undefined);
    if (!info) throw new TransportError(`could not declare stream '${config.name}': ${describe(error)}`, { cause: error, retriable: isConnectivity(error) });
    const missing = (config.subjects ?? []).filter((subject) => !info.config.subjects?.includes(subject));
    if (missing.length > 0) {
      throw new TransportError(`stream '${config.name}' exists without the subjects ${missing.map((s) => `'${s}'`).join(', ')}`, { cause: error, retriable: false });
    }
  }
}

/**
 * The durable pull consumer of (`consumer`, `source`) over `subject`: explicit acks, never
 * given up on (`max_deliver: -1`: the core decides when a message is dead), from the start
 * of the stream or from `startSeq` (an ordered group rewound to its ack floor).
 */
export function consumerConfig(names: JetStreamNames, ackWaitMs: number, consumer: string, source: string, subject: string, startSeq: number) {
  return {
    durable_name: names.durable(consumer, source),
    description: `courier consumer '${consumer}' on '${source}'`.slice(0, 4000),
    filter_subject: subject,
    ack_policy: AckPolicy.Explicit,
    ...(startSeq > 1 ? { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: startSeq } : { deliver_policy: DeliverPolicy.All }),
    ack_wait: ackWaitMs * 1_000_000,
    max_deliver: -1,
    max_ack_pending: 1_000,
  };
}
