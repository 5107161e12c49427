import type { MessageAttributeValue } from '@aws-sdk/client-sqs';
import {
  ClosedError,
  ConfigError,
  abortableSleep,
  createBus,
  describeError,
  type BusConfig,
  type Delivery,
  type DeliveryHandler,
  type Endpoint,
  type Envelope,
  type PublishResult,
  type Subscription,
  type Transport,
  type TransportCapabilities,
  type TransportDeadLetters,
} from '@courier/core';
import { ATTRIBUTES, envelopeOf } from './sqs-mapping.js';
import type { SqsTransport } from './sqs-transport.js';

/** What `relayOnce` did. */
export interface RelayOnceSummary {
  /** Messages the broker confirmed during the call. */
  readonly published: number;
  /** Publish failures during the call (each retried later by the outbox's policy). */
  readonly failed: number;
  /** Pending rows left in the outbox when the call ended (due later, or beyond the bounds). */
  readonly left: number;
  /** Why it ended: nothing was due, the count or the time bound was reached. */
  readonly ended: 'drained' | 'maxMessages' | 'maxMs';
  /** The relay's last error, if it paused (the broker or the database was unavailable). */
  readonly lastError: string | null;
  readonly durationMs: number;
}

/** Per-call arguments of {@link relayOnce}. */
export interface RelayOnceOptions {
  /** Stop starting new work after this long (default 50 s; keep it below the function's timeout). */
  readonly maxMs?: number;
  /** Stop once this many messages were published (default unbounded; may be passed by up to one relay batch). */
  readonly maxMessages?: number;
  /** How often it checks whether anything is still due (default 200 ms). */
  readonly pollMs?: number;
  /** Longest wait for work in flight when it stops (default 10 s). */
  readonly stopTimeoutMs?: number;
}

/**
 * Drains what is due in the outbox once and returns a summary, for a scheduled function
 * (EventBridge → Lambda), a cron job or a Kubernetes CronJob.
 *
 * Guarantees: it runs Courier's own relay (a bus created from `config` with the relay only),
 * so it claims under the same leases as any other relay and is safe beside them and beside
 * other `relayOnce` calls; it ends when nothing due is left (no due pending row and nothing in
 * flight, seen twice in a row), when `maxMessages` were published or after `maxMs`, then
 * stops the bus, waiting for confirms in flight (rows not completed in time are re-claimed
 * by the next relay when their lease expires). A broker outage pauses it without counting
 * attempts; the summary then says so in `lastError`.
 */
export async function relayOnce<Tx>(config: BusConfig<Tx>, options: RelayOnceOptions = {}): Promise<RelayOnceSummary> {
  const maxMs = options.maxMs ?? 50_000;
  const maxMessages = options.maxMessages ?? Number.POSITIVE_INFINITY;
  const pollMs = options.pollMs ?? 200;
  const began = Date.now();
  const bus = createBus(config);
  let ended: RelayOnceSummary['ended'] = 'maxMs';
  try {
    await bus.start({ relay: true, consumers: false });
    let idle = 0;
    while (Date.now() - began < maxMs) {
      if (bus.health().counters.published >= maxMessages) {
        ended = 'maxMessages';
        break;
      }
      const stats = await config.outbox.stats().catch(() => undefined);
      idle = stats !== undefined && stats.oldestPendingAgeMs === 0 && stats.inFlight === 0 ? idle + 1 : 0;
      if (idle >= 2) {
        ended = 'drained';
        break;
      }
      bus.wake();
      await abortableSleep(Math.min(pollMs, Math.max(0, maxMs - (Date.now() - began))));
    }
  } finally {
    await bus.stop({ timeoutMs: options.stopTimeoutMs ?? 10_000 });
  }
  const health = bus.health();
  const left = (await config.outbox.stats().catch(() => undefined))?.pending ?? -1;
  return {
    published: health.counters.published,
    failed: health.counters.publishFailures,
    left,
    ended,
    lastError: health.relay.lastError,
    durationMs: Date.now() - began,
  };
}

/** One record of an SQS event as Lambda delivers it (the subset used; `SQSRecord` of `@types/aws-lambda` fits). */
export interface SqsEventRecord {
  readonly messageId: string;
  readonly body: string;
  readonly attributes: { readonly ApproximateReceiveCount: string; readonly MessageGroupId?: string };
  readonly messageAttributes: Readonly<Record<string, { readonly stringValue?: string; readonly dataType: string }>>;
  readonly eventSourceARN: string;
}

/** An SQS event (`SQSEvent` of `@types/aws-lambda` fits). */
export interface SqsEvent {
  readonly Records: readonly SqsEventRecord[];
}

/** A partial batch response (`SQSBatchResponse`): the records to be received again. */
export interface SqsBatchResponse {
  batchItemFailures: { itemIdentifier: string }[];
}

/**
 * A transport for a consumer on a Lambda SQS event source: publishing and dead letters go
 * through `transport`, while deliveries come from the events given to {@link handler}
 * instead of a receive loop. Create the bus with it, subscribe, `start({ relay: false })`
 * once per container (outside the handler), and export `handler()`.
 *
 * Guarantees: each record runs through the bus's consumer (inbox and the handler's
 * transaction); `ack` and `deadLetter` (a copy in the consumer's dead-letter queue) leave
 * it out of `batchItemFailures`, so the event source deletes it; `retry`, a record not
 * settled, or a settle that failed is reported in `batchItemFailures`, and the event source
 * makes it visible again after the queue's visibility timeout (the retry's delay is not
 * honoured: the event source decides) until the redrive policy moves it. The attempt is
 * SQS's receive count. FIFO: a group's records run in order, and once one fails the rest
 * of its group in the batch is reported failed without running (AWS's rule for partial
 * batch responses on FIFO queues). The function needs `ReportBatchItemFailures` on.
 */
export class SqsEventSource implements Transport {
  readonly capabilities: TransportCapabilities;
  readonly deadLetters: TransportDeadLetters;
  readonly #transport: SqsTransport;
  readonly #endpoints = new Map<string, { endpoint: Endpoint; handler: DeliveryHandler }>();
  #closed = false;

  constructor(config: { readonly transport: SqsTransport }) {
    this.#transport = config.transport;
    this.capabilities = config.transport.capabilities;
    this.deadLetters = config.transport.deadLetters;
  }

  get limits(): SqsTransport['limits'] {
    return this.#transport.limits;
  }

  validate(envelope: Envelope): readonly string[] {
    return this.#transport.validate(envelope);
  }

  publish(messages: readonly Envelope[], options?: { signal?: AbortSignal }): Promise<readonly PublishResult[]> {
    return this.#transport.publish(messages, options);
  }

  /** Registers the endpoint for the queues of its topics (provisioned as `SqsTransport.subscribe` would); receives nothing itself. */
  async subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription> {
    if (this.#closed) throw new ClosedError('sqs event source is closed');
    await this.#transport.provision({ topics: endpoint.topics, consumers: [endpoint.consumer], subscriptions: { [endpoint.consumer]: endpoint.topics } });
    const names = this.#transport.queuesOf(endpoint);
    for (const name of names) this.#endpoints.set(name, { endpoint, handler });
    return {
      close: async () => {
        for (const name of names) if (this.#endpoints.get(name)?.handler === handler) this.#endpoints.delete(name);
      },
    };
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#endpoints.clear();
    await this.#transport.close();
  }

  /** The Lambda handler: `(event) => SqsBatchResponse`. */
  handler(): (event: SqsEvent) => Promise<SqsBatchResponse> {
    return (event) => this.#handle(event);
  }

  async #handle(event: SqsEvent): Promise<SqsBatchResponse> {
    const failures = new Set<string>();
    // Records of one group (FIFO) or each record alone (standard) form a chain run in order.
    const chains = new Map<string, SqsEventRecord[]>();
    for (const record of event.Records) {
      const chain = record.attributes.MessageGroupId ?? `\0${record.messageId}`;
      chains.set(chain, [...(chains.get(chain) ?? []), record]);
    }
    const queue = [...chains.values()];
    const runChain = async (records: readonly SqsEventRecord[]): Promise<void> => {
      for (const [index, record] of records.entries()) {
        if (!(await this.#run(record))) {
          for (const rest of records.slice(index)) failures.add(rest.messageId);
          return;
        }
      }
    };
    const concurrency = Math.max(1, ...[...this.#endpoints.values()].map(({ endpoint }) => endpoint.concurrency));
    await Promise.all(
      Array.from({ length: Math.min(concurrency, queue.length) }, async () => {
        for (let chain = queue.shift(); chain !== undefined; chain = queue.shift()) await runChain(chain);
      }),
    );
    return { batchItemFailures: event.Records.filter((record) => failures.has(record.messageId)).map((record) => ({ itemIdentifier: record.messageId })) };
  }

  /** Runs one record through the bus; true when the event source may delete it. */
  async #run(record: SqsEventRecord): Promise<boolean> {
    const queueName = record.eventSourceARN.split(':').at(-1) ?? '';
    const target = this.#endpoints.get(queueName);
    if (target === undefined) throw new ConfigError(`no consumer of this bus reads queue '${queueName}' (subscribe it and start the bus before the handler runs)`);
    const attributes: Record<string, MessageAttributeValue> = {};
    for (const [name, value] of Object.entries(record.messageAttributes)) {
      if (value.stringValue !== undefined) attributes[name] = { DataType: value.dataType, StringValue: value.stringValue };
    }
    const receiveCount = Math.max(1, Number(record.attributes.ApproximateReceiveCount) || 1);
    let envelope: Envelope;
    try {
      envelope = envelopeOf(record.body, attributes);
    } catch (error) {
      await this.#transport.deadLetterCopy(target.endpoint.consumer, { id: record.messageId, body: record.body, attributes, groupId: record.attributes.MessageGroupId }, { code: 'ENVELOPE_INVALID', message: describeError(error) }, receiveCount);
      return true;
    }
    let outcome: 'ack' | 'retry' | 'dead' | undefined;
    const settle = async (kind: 'ack' | 'retry' | 'dead', act?: () => Promise<void>): Promise<void> => {
      if (outcome !== undefined) return;
      outcome = kind;
      if (act) await act();
    };
    const delivery: Delivery = {
      envelope,
      attempt: receiveCount,
      redelivered: receiveCount > 1,
      ...(attributes[ATTRIBUTES.replay] ? { replayed: true } : {}),
      ack: () => settle('ack'),
      retry: () => settle('retry'),
      deadLetter: (reason) =>
        settle('dead', () =>
          this.#transport.deadLetterCopy(target.endpoint.consumer, { id: record.messageId, body: record.body, attributes, groupId: record.attributes.MessageGroupId }, reason, receiveCount),
        ),
    };
    try {
      await target.handler(delivery);
    } catch {
      return false;
    }
    return outcome === 'ack' || outcome === 'dead';
  }
}
