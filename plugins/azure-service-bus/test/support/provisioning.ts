// Entities for the tests on a real namespace (or the official emulator), created through
// the administration (ATOM) API before a test sends or receives, and deleted after it. The
// stand-in has no ATOM API and creates entities on first use instead, so none of this runs
// against it; the decisions below are unit-tested in provisioning.test.ts with a fake.
import type { CreateQueueOptions, CreateSubscriptionOptions, CreateTopicOptions, ServiceBusAdministrationClient } from '@azure/service-bus';

/** The administration calls the provisioner makes (a ServiceBusAdministrationClient, or a fake). */
export type AdministrationPort = Pick<
  ServiceBusAdministrationClient,
  'topicExists' | 'createTopic' | 'subscriptionExists' | 'createSubscription' | 'getSubscription' | 'deleteSubscription' | 'deleteTopic' | 'queueExists' | 'createQueue' | 'getQueue' | 'deleteQueue'
>;

/** Service Bus accepts lock durations from 5 s to 5 min. */
const MIN_LOCK_MS = 5_000;
const MAX_LOCK_MS = 300_000;

/** A duration in ISO-8601 (`PT5S`, `PT1M30S`), whole seconds rounded up, as the ATOM API takes it. */
export function isoDuration(ms: number): string {
  const total = Math.max(1, Math.ceil(ms / 1_000));
  const minutes = Math.floor(total / 60);
  const seconds = total % 60;
  return `PT${minutes > 0 ? `${minutes}M` : ''}${seconds > 0 || minutes === 0 ? `${seconds}S` : ''}`;
}

/** The lock duration a namespace accepts closest to `ms`. */
export const namespaceLockMs = (ms: number): number => Math.min(MAX_LOCK_MS, Math.max(MIN_LOCK_MS, ms));

/** What the tests need of every entity. */
export interface EntityNeeds {
  /** Peek-lock and session lock duration (clamped to what Service Bus accepts). */
  readonly lockDurationMs: number;
  /** MaxDeliveryCount: high for the transport tests, where Courier counts attempts itself. */
  readonly maxDeliveryCount: number;
  /** Duplicate detection on topics and queues (the fixture's injectDuplicate relies on it being on). */
  readonly duplicateDetection: boolean;
  /** Entities delete themselves after this much idleness if a run died before cleaning up (at least 5 min). */
  readonly autoDeleteOnIdleMs: number;
}

const isAlreadyExists = (error: unknown): boolean => {
  const { code, statusCode } = (error ?? {}) as { code?: string; statusCode?: number };
  return statusCode === 409 || code === 'MessageEntityAlreadyExistsError' || code === 'MessagingEntityAlreadyExists';
};

/**
 * Creates topics, subscriptions and queues once each, however many tests (or concurrent
 * calls) ask, and deletes what it created on `cleanup`. An entity that already exists is
 * used as it is, unless its session setting differs from what the test needs (a session
 * setting cannot be changed once an entity exists): then it says so instead of letting the
 * test fail in a confusing way.
 */
export class Provisioner {
  readonly #pending = new Map<string, Promise<void>>();
  readonly #createdTopics = new Set<string>();
  readonly #createdQueues = new Set<string>();
  /** Subscriptions created on topics this provisioner did not create (deleting a topic takes its own along). */
  readonly #createdSubscriptions = new Set<string>();

  constructor(
    private readonly admin: AdministrationPort,
    private readonly needs: EntityNeeds,
  ) {}

  /** Options of a topic: duplicate detection as needed, auto-delete as a safety net. */
  topicOptions(): CreateTopicOptions {
    return {
      requiresDuplicateDetection: this.needs.duplicateDetection,
      ...(this.needs.duplicateDetection ? { duplicateDetectionHistoryTimeWindow: 'PT10M' } : {}),
      autoDeleteOnIdle: isoDuration(Math.max(300_000, this.needs.autoDeleteOnIdleMs)),
    };
  }

  /** Options of a subscription: sessions for ordered consumers, the tests' lock and delivery count. */
  subscriptionOptions(requiresSession: boolean): CreateSubscriptionOptions {
    return {
      requiresSession,
      lockDuration: isoDuration(namespaceLockMs(this.needs.lockDurationMs)),
      maxDeliveryCount: this.needs.maxDeliveryCount,
      deadLetteringOnMessageExpiration: false,
      autoDeleteOnIdle: isoDuration(Math.max(300_000, this.needs.autoDeleteOnIdleMs)),
    };
  }

  /** Options of a queue (the stand-in tests' entities). */
  queueOptions(requiresSession: boolean, duplicateDetection: boolean): CreateQueueOptions {
    return {
      requiresSession,
      requiresDuplicateDetection: duplicateDetection,
      ...(duplicateDetection ? { duplicateDetectionHistoryTimeWindow: 'PT10M' } : {}),
      lockDuration: isoDuration(namespaceLockMs(this.needs.lockDurationMs)),
      maxDeliveryCount: this.needs.maxDeliveryCount,
      autoDeleteOnIdle: isoDuration(Math.max(300_000, this.needs.autoDeleteOnIdleMs)),
    };
  }

  /** Makes sure the topic exists. */
  ensureTopic(topic: string): Promise<void> {
    return this.#once(`topic\n${topic}`, async () => {
      if (await this.admin.topicExists(topic)) return;
      try {
        await this.admin.createTopic(topic, this.topicOptions());
        this.#createdTopics.add(topic);
      } catch (error) {
        // Another process of the same test (a worker) created it first: fine.
        if (!isAlreadyExists(error)) throw error;
      }
    });
  }

  /** Makes sure the topic and its subscription exist, session-enabled exactly when `requiresSession`. */
  ensureSubscription(topic: string, subscription: string, requiresSession: boolean): Promise<void> {
    return this.#once(`subscription\n${topic}\n${subscription}`, async () => {
      await this.ensureTopic(topic);
      if (!(await this.admin.subscriptionExists(topic, subscription))) {
        try {
          await this.admin.createSubscription(topic, subscription, this.subscriptionOptions(requiresSession));
          if (!this.#createdTopics.has(topic)) this.#createdSubscriptions.add(`${topic}\n${subscription}`);
          return;
        } catch (error) {
          if (!isAlreadyExists(error)) throw error;
        }
      }
      const existing = await this.admin.getSubscription(topic, subscription);
      if (existing.requiresSession !== requiresSession) {
        throw new Error(`subscription '${subscription}' of topic '${topic}' exists with requiresSession ${existing.requiresSession}, the test needs ${requiresSession}; delete it or use another prefix`);
      }
    });
  }

  /** Makes sure the queue exists with the session setting asked for. */
  ensureQueue(queue: string, requiresSession: boolean, duplicateDetection: boolean): Promise<void> {
    return this.#once(`queue\n${queue}`, async () => {
      if (!(await this.admin.queueExists(queue))) {
        try {
          await this.admin.createQueue(queue, this.queueOptions(requiresSession, duplicateDetection));
          this.#createdQueues.add(queue);
          return;
        } catch (error) {
          if (!isAlreadyExists(error)) throw error;
        }
      }
      const existing = await this.admin.getQueue(queue);
      if (existing.requiresSession !== requiresSession) {
        throw new Error(`queue '${queue}' exists with requiresSession ${existing.requiresSession}, the test needs ${requiresSession}; delete it or use another name`);
      }
    });
  }

  /** Deletes every topic (with its subscriptions), queue and subscription this provisioner created; reports, not throws, what it could not delete. */
  async cleanup(): Promise<string[]> {
    const failures: string[] = [];
    const topics = [...this.#createdTopics];
    const queues = [...this.#createdQueues];
    const subscriptions = [...this.#createdSubscriptions].map((key) => key.split('\n') as [string, string]);
    this.#createdSubscriptions.clear();
    this.#createdTopics.clear();
    this.#createdQueues.clear();
    this.#pending.clear();
    await Promise.all([
      ...subscriptions.map(([topic, name]) => this.admin.deleteSubscription(topic, name).catch((error: unknown) => void failures.push(`subscription ${topic}/${name}: ${String(error)}`))),
      ...topics.map((topic) => this.admin.deleteTopic(topic).catch((error: unknown) => void failures.push(`topic ${topic}: ${String(error)}`))),
      ...queues.map((queue) => this.admin.deleteQueue(queue).catch((error: unknown) => void failures.push(`queue ${queue}: ${String(error)}`))),
    ]);
    return failures;
  }

  /** Runs `create` once per key; a failed run is forgotten, so a later call tries again. */
  #once(key: string, create: () => Promise<void>): Promise<void> {
    let pending = this.#pending.get(key);
    if (!pending) {
      pending = create();
      this.#pending.set(key, pending);
      pending.catch(() => this.#pending.delete(key));
    }
    return pending;
  }
}
