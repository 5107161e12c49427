// A stand-in for Azure Service Bus: an AMQP 1.0 server written with rhea that answers the
// real, unmodified @azure/service-bus client (connection string with
// `UseDevelopmentEmulator=true`) for the subset of Service Bus the Courier transport relies
// on. It is a test tool, not an emulator: every behaviour here follows a Microsoft
// documentation page (linked where it is implemented, and in standin/README.md), and the
// tests in test/standin.test.ts hold it to them. Anything not listed there is not imitated.
//
// Entities are created on first use (of the ATOM management API the stand-in answers only the
// GET of a queue or subscription, which creates nothing): a receiver
// attaching to `<topic>/Subscriptions/<name>` creates that topic and subscription; any other
// unknown path becomes a queue, unless `isTopic(path)` says it is a topic (which, like a real
// topic without subscriptions, then drops what is sent to it). `entityDefaults(path)`
// decides the settings of each queue and subscription.
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import rhea, { type Connection, type Delivery, type EventContext, type Message, type Sender } from 'rhea';

/** Settings of one queue or subscription (the names of the Service Bus properties). */
export interface StandInEntityOptions {
  /** `RequiresSession`: every message needs a sessionId; receivers lock one session at a time. */
  readonly requiresSession?: boolean;
  /** `MaxDeliveryCount` (default 10): after that many deliveries the message is dead-lettered. */
  readonly maxDeliveryCount?: number;
  /** `LockDuration` (default 60 s): peek-lock and session locks expire after it unless renewed. */
  readonly lockDurationMs?: number;
  /** `RequiresDuplicateDetection`: a messageId seen within the window is accepted and dropped. */
  readonly duplicateDetection?: boolean;
  /** `DuplicateDetectionHistoryTimeWindow` (default 10 min). */
  readonly duplicateWindowMs?: number;
}

/** Configuration of a stand-in server. */
export interface ServiceBusStandInConfig {
  /** Port to listen on (default: a free one). Host is always 127.0.0.1. */
  readonly port?: number;
  /** Settings for an entity created on first use; `path` is the queue, topic or `<topic>/Subscriptions/<name>`. */
  readonly entityDefaults?: (path: string) => StandInEntityOptions;
  /** Whether an unknown path a sender names is a topic (default: none is; subscriptions create their topic). */
  readonly isTopic?: (path: string) => boolean;
  /** Test hook: a reason to refuse a message sent (rejected with `amqp:not-allowed`), as a broker refusing it for its content. */
  readonly refuse?: (message: Message) => string | undefined;
  /** Largest encoded message (or batch) a sender may transfer; the link's max-message-size. Default 256 KiB (Standard tier). */
  readonly maxMessageBytes?: number;
  /**
   * Test hook: answer a receiver's drain this much later (default at once), as a busy broker
   * or a loaded machine does. The SDK gives a drain 200 ms and then closes the link, which
   * loses the session lock of a session receiver (its unsettled messages come back after
   * their lock with DeliveryCount + 1).
   */
  readonly drainDelayMs?: number;
}

interface StoredMessage {
  readonly sequenceNumber: number;
  body: Message;
  readonly enqueuedAt: number;
  availableAt: number;
  deliveryCount: number;
  sessionId: string | undefined;
  lock: { token: string; until: number; link: Sender; delivery: Delivery | undefined } | undefined;
  deferred: boolean;
  deadLetter: { reason: string | undefined; description: string | undefined; source: string | undefined } | undefined;
}

interface ReceiverLink {
  readonly link: Sender;
  readonly entity: MessageEntity;
  readonly peekLock: boolean;
  /** Locked session for a session receiver. */
  session: string | undefined;
}

/** An accept of the next free session whose attach answer is held until a session is free or its time is up. */
interface WaitingAccept {
  readonly link: Sender;
  readonly address: string;
  readonly timer: NodeJS.Timeout;
}

/** How long an accept waits when the client sends no com.microsoft:timeout (the service's own bound). */
const DEFAULT_ACCEPT_WAIT_MS = 65_000;

/** rhea sends a link's attach answer when it has an open request: holding it back keeps the client waiting. */
const attachState = (link: Sender) => (link as unknown as { state: { open_requests: number } }).state;

/** A core-rest-pipeline policy (structurally: the stand-in does not depend on @azure/core-rest-pipeline). */
interface ManagementPolicy {
  readonly name: string;
  sendRequest(request: { url: string; allowInsecureConnection?: boolean }, next: (request: { url: string }) => Promise<unknown>): Promise<unknown>;
}

const escapeXml = (text: string): string => text.replace(/[<>&'"]/g, (c) => `&#${c.charCodeAt(0)};`);

const TICKS_AT_EPOCH = 621_355_968_000_000_000n;

/** A queue, a subscription or a dead-letter sub-queue: where messages wait for receivers. */
class MessageEntity {
  readonly messages: StoredMessage[] = [];
  readonly receivers = new Set<ReceiverLink>();
  readonly sessionLocks = new Map<string, { link: ReceiverLink; until: number }>();
  /** Next-session accepts waiting for a session with messages, oldest first. */
  readonly waitingAccepts = new Set<WaitingAccept>();
  deadLetterQueue: MessageEntity | undefined;
  /** Which receiver gets the next message. */
  turn = 0;

  constructor(
    readonly path: string,
    readonly options: Required<StandInEntityOptions>,
    private readonly server: ServiceBusStandIn,
  ) {}

  enqueue(body: Message, availableAt: number, sessionId: string | undefined, deadLetter?: StoredMessage['deadLetter'], deliveryCount = 0): StoredMessage {
    const stored: StoredMessage = {
      sequenceNumber: this.server.nextSequence(),
      body,
      enqueuedAt: Date.now(),
      availableAt,
      deliveryCount,
      sessionId,
      lock: undefined,
      deferred: false,
      deadLetter,
    };
    this.messages.push(stored);
    this.server.schedulePump(this, availableAt);
    return stored;
  }

  remove(message: StoredMessage): void {
    const index = this.messages.indexOf(message);
    if (index >= 0) this.messages.splice(index, 1);
  }
}

/**
 * The stand-in server. `start()` listens on 127.0.0.1; `connectionString` is what the SDK
 * takes. `close()` drops every connection. `throttle(path, true)` makes sends to a path fail
 * with `com.microsoft:server-busy` (the ServiceBusy code), as a throttled namespace does.
 */
export class ServiceBusStandIn {
  private readonly container = rhea.create_container({ id: 'courier-service-bus-standin' });
  private listener: ReturnType<typeof rhea.listen> | undefined;
  private readonly topics = new Map<string, Map<string, MessageEntity>>();
  private readonly queues = new Map<string, MessageEntity>();
  private readonly throttled = new Set<string>();
  private readonly duplicates = new Map<string, Map<string, number>>();
  private readonly connections = new Set<Connection>();
  /** Receiver links whose drain answer is held back (drainDelayMs). */
  private readonly slowDrains = new Set<Sender>();
  private readonly timers = new Set<NodeJS.Timeout>();
  /** Server-side senders of `$cbs` / `$management`, by connection and link name: replies go to the link named by reply_to. */
  private readonly replyLinks = new WeakMap<Connection, Map<string, Sender>>();
  private sequence = 0;
  private lockSweeper: NodeJS.Timeout | undefined;
  private portNumber = 0;
  private management: Server | undefined;
  private managementPortNumber = 0;

  constructor(private readonly config: ServiceBusStandInConfig = {}) {}

  /** Starts listening; resolves once the port is bound. */
  static async start(config: ServiceBusStandInConfig = {}): Promise<ServiceBusStandIn> {
    const server = new ServiceBusStandIn(config);
    await server.listen();
    return server;
  }

  /** The port the server listens on. */
  get port(): number {
    return this.portNumber;
  }

  /**
   * The port of the management endpoint (plain HTTP on 127.0.0.1): the ATOM `GET` of a
   * queue or subscription, nothing else. `@azure/service-bus`'s administration client
   * always speaks HTTPS to the connection string's host, so a test sends its requests here
   * with a pipeline policy ({@link ServiceBusStandIn.managementPolicy}).
   */
  get managementPort(): number {
    return this.managementPortNumber;
  }

  /**
   * A pipeline policy for `administrationClient.pipeline.addPolicy(policy)` (the client's
   * constructor ignores `additionalPolicies`) that sends its requests to this stand-in's
   * management endpoint (`port`: another stand-in's, by default this one's).
   */
  managementPolicy(port = this.managementPortNumber): ManagementPolicy {
    return ServiceBusStandIn.managementPolicyFor(port);
  }

  /** {@link ServiceBusStandIn.managementPolicy} for a stand-in known only by its management port (one another process started). */
  static managementPolicyFor(port: number): ManagementPolicy {
    return {
      name: 'courier-standin-management',
      sendRequest(request, next) {
        const url = new URL(request.url);
        request.url = `http://127.0.0.1:${port}${url.pathname}${url.search}`;
        // Plain HTTP to the stand-in on loopback only: the pipeline refuses it otherwise.
        request.allowInsecureConnection = true;
        return next(request);
      },
    };
  }

  /** A connection string for `new ServiceBusClient(...)` (any key: CBS accepts every token). */
  get connectionString(): string {
    return `Endpoint=sb://127.0.0.1:${this.portNumber};SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=standin;UseDevelopmentEmulator=true`;
  }

  /** Makes sends to `path` (a queue or topic) fail with `com.microsoft:server-busy` while on. */
  throttle(path: string, on: boolean): void {
    if (on) this.throttled.add(path);
    else this.throttled.delete(path);
  }

  /** Messages currently held by a queue, subscription or dead-letter path (for tests). */
  count(path: string): number {
    return this.findEntity(path)?.messages.length ?? 0;
  }

  /**
   * Messages of a queue or subscription whose lock holds now (for tests that must act once a
   * lock ran out, not after a sleep that guesses when it has).
   */
  locked(path: string): number {
    const entity = this.findEntity(path);
    return entity ? entity.messages.filter((message) => this.lockHeld(entity, message)).length : 0;
  }

  /**
   * Next-session accepts held open on a queue or subscription, waiting for a session with
   * messages (for tests that must act while one waits, not before it arrived).
   */
  waitingAccepts(path: string): number {
    return this.findEntity(path)?.waitingAccepts.size ?? 0;
  }

  /** Names of the topics that exist (for tests that list what a prefix created). */
  topicNames(): string[] {
    return [...this.topics.keys()];
  }

  /** Names of the queues that exist (for tests that list what a prefix created). */
  queueNames(): string[] {
    return [...this.queues.keys()];
  }

  /** Cuts every client connection without closing AMQP-wise, as a network failure would. */
  dropConnections(): void {
    for (const connection of this.connections) connection.socket?.destroy();
  }

  /** Stops listening and cuts every connection. Idempotent. */
  async close(): Promise<void> {
    for (const timer of this.timers) clearTimeout(timer);
    this.timers.clear();
    for (const entity of this.allEntities()) for (const waiting of entity.waitingAccepts) clearTimeout(waiting.timer);
    if (this.lockSweeper) clearInterval(this.lockSweeper);
    this.lockSweeper = undefined;
    this.dropConnections();
    const listener = this.listener;
    this.listener = undefined;
    if (listener) await new Promise<void>((resolve) => listener.close(() => resolve()));
    const management = this.management;
    this.management = undefined;
    management?.closeAllConnections();
    if (management) await new Promise<void>((resolve) => management.close(() => resolve()));
  }

  /** @internal */
  nextSequence(): number {
    this.sequence += 1;
    return this.sequence;
  }

  /** @internal: delivers what became available at `at` (scheduled messages, abandon-after-delay). */
  schedulePump(entity: MessageEntity, at: number): void {
    const wait = at - Date.now();
    if (wait <= 0) {
      setImmediate(() => this.pump(entity));
      return;
    }
    const timer = setTimeout(() => {
      this.timers.delete(timer);
      this.pump(entity);
    }, wait);
    this.timers.add(timer);
  }

  private async listen(): Promise<void> {
    this.container.sasl_server_mechanisms.enable_anonymous();
    // The SDK sends the SAS key name and a token over CBS; SASL PLAIN is accepted as well.
    this.container.sasl_server_mechanisms.enable_plain(() => true);
    this.container.on('connection_open', (context: EventContext) => {
      this.connections.add(context.connection);
    });
    const forget = (context: EventContext) => {
      this.connections.delete(context.connection);
      this.releaseConnection(context.connection);
    };
    this.container.on('connection_close', forget);
    this.container.on('disconnected', forget);
    this.container.on('connection_error', () => undefined);
    this.container.on('error', () => undefined);
    this.container.on('sender_open', (context: EventContext) => this.onReceiverAttach(context));
    this.container.on('receiver_open', (context: EventContext) => this.onSenderAttach(context));
    this.container.on('message', (context: EventContext) => this.onMessage(context));
    this.container.on('sendable', (context: EventContext) => {
      const receiver = this.receiverOf(context.sender);
      if (receiver) this.pump(receiver.entity);
    });
    this.container.on('sender_close', (context: EventContext) => this.releaseLink(context.sender));
    this.container.on('accepted', (context: EventContext) => this.onDisposition(context, 'accepted'));
    this.container.on('released', (context: EventContext) => this.onDisposition(context, 'released'));
    this.container.on('rejected', (context: EventContext) => this.onDisposition(context, 'rejected'));
    this.listener = this.container.listen({ port: this.config.port ?? 0, host: '127.0.0.1' });
    await new Promise<void>((resolve, reject) => {
      this.listener?.once('listening', () => resolve());
      this.listener?.once('error', reject);
    });
    this.portNumber = (this.listener.address() as AddressInfo).port;
    // Lock expiry (https://learn.microsoft.com/azure/service-bus-messaging/message-transfers-locks-settlement#peeklock):
    // a lock that runs out makes the message available again, its delivery count kept.
    this.lockSweeper = setInterval(() => this.expireLocks(), 100);
    this.lockSweeper.unref();
    this.management = createServer((request, response) => this.onManagementRequest(request, response));
    const management = this.management;
    await new Promise<void>((resolve, reject) => {
      management.once('error', reject);
      management.listen(0, '127.0.0.1', () => resolve());
    });
    this.managementPortNumber = (management.address() as AddressInfo).port;
  }

  // ---- management (ATOM) ----------------------------------------------------------------

  /**
   * `GET /<queue>` and `GET /<topic>/Subscriptions/<name>` of the management API
   * (https://learn.microsoft.com/rest/api/servicebus/get-entity): an ATOM entry with the
   * entity's description and CountDetails, or 404 with the service's error body when the
   * entity does not exist. Reading creates nothing (unlike the AMQP side's first use). Any
   * other request is answered 501: the rest of the management API is not imitated.
   */
  private onManagementRequest(request: IncomingMessage, response: ServerResponse): void {
    const url = new URL(request.url ?? '/', 'http://standin');
    const path = decodeURIComponent(url.pathname.replace(/^\/+/, ''));
    const subscription = /^(.+)\/subscriptions\/([^/]+)$/i.exec(path);
    const isQueuePath = !subscription && !path.includes('/');
    if (request.method !== 'GET' || (!subscription && !isQueuePath) || path.toLowerCase().endsWith('/$deadletterqueue')) {
      response.writeHead(501, { 'content-type': 'text/plain' }).end('not imitated by the stand-in: only GET of a queue or subscription');
      return;
    }
    const entity = this.findEntity(path);
    if (!entity || (isQueuePath && this.topics.has(path.toLowerCase()))) {
      // The service's body for a missing entity (status 404, code MessageEntityNotFoundError in the SDK).
      response
        .writeHead(404, { 'content-type': 'application/xml; charset=utf-8' })
        .end(`<Error><Code>404</Code><Detail>The messaging entity '${escapeXml(path)}' could not be found.</Detail></Error>`);
      return;
    }
    response.writeHead(200, { 'content-type': 'application/atom+xml;type=entry;charset=utf-8' }).end(this.atomEntry(path, entity, subscription !== null));
  }

  private atomEntry(path: string, entity: MessageEntity, isSubscription: boolean): string {
    const now = Date.now();
    const active = entity.messages.filter((message) => message.availableAt <= now).length;
    const scheduled = entity.messages.length - active;
    const dead = entity.deadLetterQueue?.messages.length ?? 0;
    const forever = 'P10675199DT2H48M5.4775807S';
    const at = new Date(now).toISOString();
    const kind = isSubscription ? 'SubscriptionDescription' : 'QueueDescription';
    const own = isSubscription
      ? ''
      : `<MaxSizeInMegabytes>1024</MaxSizeInMegabytes><SizeInBytes>0</SizeInBytes><RequiresDuplicateDetection>${entity.options.duplicateDetection}</RequiresDuplicateDetection>` +
        `<DuplicateDetectionHistoryTimeWindow>PT${entity.options.duplicateWindowMs / 1000}S</DuplicateDetectionHistoryTimeWindow><EnablePartitioning>false</EnablePartitioning><EnableExpress>false</EnableExpress>` +
        `<AuthorizationRules/>`;
    return (
      `<entry xmlns="http://www.w3.org/2005/Atom"><id>https://127.0.0.1/${escapeXml(path)}?api-version=2021-05</id><title type="text">${escapeXml(path)}</title>` +
      `<published>${at}</published><updated>${at}</updated><content type="application/xml">` +
      `<${kind} xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect" xmlns:i="http://www.w3.org/2001/XMLSchema-instance">` +
      `<LockDuration>PT${entity.options.lockDurationMs / 1000}S</LockDuration>${own}<RequiresSession>${entity.options.requiresSession}</RequiresSession>` +
      `<DefaultMessageTimeToLive>${forever}</DefaultMessageTimeToLive><DeadLetteringOnMessageExpiration>false</DeadLetteringOnMessageExpiration>` +
      (isSubscription ? '<DeadLetteringOnFilterEvaluationExceptions>true</DeadLetteringOnFilterEvaluationExceptions>' : '') +
      `<MessageCount>${entity.messages.length + dead}</MessageCount><MaxDeliveryCount>${entity.options.maxDeliveryCount}</MaxDeliveryCount>` +
      `<EnableBatchedOperations>true</EnableBatchedOperations><Status>Active</Status><CreatedAt>${at}</CreatedAt><UpdatedAt>${at}</UpdatedAt><AccessedAt>${at}</AccessedAt>` +
      `<CountDetails xmlns:d2p1="http://schemas.microsoft.com/netservices/2011/06/servicebus"><d2p1:ActiveMessageCount>${active}</d2p1:ActiveMessageCount>` +
      `<d2p1:DeadLetterMessageCount>${dead}</d2p1:DeadLetterMessageCount><d2p1:ScheduledMessageCount>${scheduled}</d2p1:ScheduledMessageCount>` +
      `<d2p1:TransferMessageCount>0</d2p1:TransferMessageCount><d2p1:TransferDeadLetterMessageCount>0</d2p1:TransferDeadLetterMessageCount></CountDetails>` +
      `<AutoDeleteOnIdle>${forever}</AutoDeleteOnIdle><EntityAvailabilityStatus>Available</EntityAvailabilityStatus></${kind}></content></entry>`
    );
  }

  // ---- entities -------------------------------------------------------------------------

  private defaults(path: string): Required<StandInEntityOptions> {
    const given = this.config.entityDefaults?.(path) ?? {};
    return {
      requiresSession: given.requiresSession ?? false,
      maxDeliveryCount: given.maxDeliveryCount ?? 10,
      lockDurationMs: given.lockDurationMs ?? 60_000,
      duplicateDetection: given.duplicateDetection ?? false,
      duplicateWindowMs: given.duplicateWindowMs ?? 600_000,
    };
  }

  private makeEntity(path: string, sessionful = false): MessageEntity {
    const options = this.defaults(path);
    const entity = new MessageEntity(path, sessionful ? { ...options, requiresSession: true } : options, this);
    // Every queue and subscription has a dead-letter sub-queue at <path>/$DeadLetterQueue
    // (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-dead-letter-queues).
    entity.deadLetterQueue = new MessageEntity(`${path}/$DeadLetterQueue`, { ...entity.options, requiresSession: false }, this);
    return entity;
  }

  private findEntity(path: string): MessageEntity | undefined {
    const lower = path.toLowerCase();
    const deadLetter = lower.endsWith('/$deadletterqueue');
    const base = deadLetter ? path.slice(0, -'/$DeadLetterQueue'.length) : path;
    const match = /^(.+)\/subscriptions\/([^/]+)$/i.exec(base);
    const entity = match ? this.topics.get(match[1]!.toLowerCase())?.get(match[2]!.toLowerCase()) : this.queues.get(base.toLowerCase());
    return deadLetter ? entity?.deadLetterQueue : entity;
  }

  /** Finds or creates the queue, subscription or dead-letter queue a receiver names. */
  private receivingEntity(path: string, sessionful = false): MessageEntity {
    const found = this.findEntity(path);
    if (found) return found;
    const deadLetter = path.toLowerCase().endsWith('/$deadletterqueue');
    const base = deadLetter ? path.slice(0, -'/$DeadLetterQueue'.length) : path;
    const match = /^(.+)\/subscriptions\/([^/]+)$/i.exec(base);
    let entity: MessageEntity;
    if (match) {
      const topic = match[1]!.toLowerCase();
      const subscriptions = this.topics.get(topic) ?? new Map<string, MessageEntity>();
      this.topics.set(topic, subscriptions);
      entity = this.makeEntity(base, sessionful);
      subscriptions.set(match[2]!.toLowerCase(), entity);
    } else {
      entity = this.makeEntity(base);
      this.queues.set(base.toLowerCase(), entity);
    }
    return deadLetter ? entity.deadLetterQueue! : entity;
  }

  /** Where a message sent to `path` goes: the queue, or every subscription of the topic. */
  private sendTargets(path: string): { targets: MessageEntity[]; options: Required<StandInEntityOptions> } {
    const queue = this.queues.get(path.toLowerCase());
    if (queue) return { targets: [queue], options: queue.options };
    if (!this.topics.has(path.toLowerCase()) && !this.config.isTopic?.(path)) {
      const created = this.receivingEntity(path);
      return { targets: [created], options: created.options };
    }
    const subscriptions = this.topics.get(path.toLowerCase()) ?? new Map<string, MessageEntity>();
    this.topics.set(path.toLowerCase(), subscriptions);
    return { targets: [...subscriptions.values()], options: this.defaults(path) };
  }

  // ---- links ----------------------------------------------------------------------------

  /** The client attached a sender: we receive on it. `$cbs` and `$management` are request nodes. */
  private onSenderAttach(context: EventContext): void {
    const link = context.receiver!;
    const address = String(link.target?.address ?? '');
    // Largest message a sender may transfer: the SDK sizes createMessageBatch from it.
    (link as unknown as { local: { attach: { max_message_size: number } } }).local.attach.max_message_size = this.config.maxMessageBytes ?? 256 * 1024;
    if (address === '$cbs' || address.endsWith('$management')) return;
    if (address.toLowerCase().endsWith('/$deadletterqueue')) {
      link.close({ condition: 'amqp:not-allowed', description: 'cannot send to a dead-letter queue' });
    }
  }

  /** The client attached a receiver: we send on it (entity deliveries, or replies of a request node). */
  private onReceiverAttach(context: EventContext): void {
    const link = context.sender!;
    const address = String(link.source?.address ?? '');
    if (address === '$cbs' || address.endsWith('$management')) {
      const named = this.replyLinks.get(link.connection) ?? new Map<string, Sender>();
      this.replyLinks.set(link.connection, named);
      named.set(link.name, link);
      return;
    }
    const filter = (link.source as { filter?: Record<string, unknown> } | undefined)?.filter;
    // A subscription first reached by a session receiver is created session-enabled, as a
    // Courier ordered consumer's subscription is provisioned (a stand-in convenience).
    const entity = this.receivingEntity(address, filter !== undefined && 'com.microsoft:session-filter' in filter);
    const settleMode = (link as unknown as { remote: { attach: { snd_settle_mode: number; rcv_settle_mode: number } } }).remote.attach;
    const receiver: ReceiverLink = { link, entity, peekLock: settleMode.snd_settle_mode !== 1, session: undefined };
    if (entity.options.requiresSession) {
      // Sessions (https://learn.microsoft.com/azure/service-bus-messaging/message-sessions): a
      // receiver locks one session — the one it names, or the next one with messages
      // available — and gets only that session's messages, in order, while it holds the lock.
      const wanted = filter && 'com.microsoft:session-filter' in filter ? filter['com.microsoft:session-filter'] : undefined;
      if (typeof wanted !== 'string') {
        const session = this.nextFreeSession(entity);
        if (session === undefined) {
          this.holdAccept(entity, link, address);
          return;
        }
        this.lockSession(entity, receiver, address, session);
      } else {
        const holder = entity.sessionLocks.get(wanted);
        if (holder && holder.until > Date.now() && holder.link.link.is_open()) {
          link.close({ condition: 'com.microsoft:session-cannot-be-locked', description: `session ${wanted} is locked by another receiver` });
          return;
        }
        this.lockSession(entity, receiver, address, wanted);
      }
    }
    entity.receivers.add(receiver);
    this.pump(entity);
  }

  /** Gives `session` to a session receiver: its lock, and the attach answer naming it. */
  private lockSession(entity: MessageEntity, receiver: ReceiverLink, address: string, session: string): void {
    const link = receiver.link;
    receiver.session = session;
    const until = Date.now() + entity.options.lockDurationMs;
    entity.sessionLocks.set(session, { link: receiver, until });
    const local = (link as unknown as { local: { attach: { source: unknown; properties: Record<string, unknown> } } }).local.attach;
    link.set_source({ address, filter: { 'com.microsoft:session-filter': session } });
    local.properties = { ...(local.properties ?? {}), 'com.microsoft:locked-until-utc': toTicks(until) };
  }

  /**
   * Accepting the next session when none is free waits, as the service does, until a
   * session with messages is free or the client's operation timeout (the link's
   * com.microsoft:timeout property) passes; then the attach is refused with
   * com.microsoft:timeout, which the SDK reports as ServiceTimeout
   * (https://learn.microsoft.com/dotnet/api/azure.messaging.servicebus.servicebusclient.acceptnextsessionasync).
   */
  private holdAccept(entity: MessageEntity, link: Sender, address: string): void {
    attachState(link).open_requests = 0;
    const requested = Number((link as unknown as { remote: { attach: { properties?: Record<string, unknown> } } }).remote.attach.properties?.['com.microsoft:timeout']);
    const waitMs = Number.isFinite(requested) && requested > 0 ? requested : DEFAULT_ACCEPT_WAIT_MS;
    const waiting: WaitingAccept = {
      link,
      address,
      timer: setTimeout(() => {
        if (!entity.waitingAccepts.delete(waiting)) return;
        attachState(link).open_requests = 1;
        link.close({ condition: 'com.microsoft:timeout', description: 'no session with messages became available within the timeout' });
      }, waitMs),
    };
    entity.waitingAccepts.add(waiting);
  }

  /** Answers waiting accepts, oldest first, while sessions with messages are free. */
  private grantWaitingAccepts(entity: MessageEntity): void {
    for (const waiting of [...entity.waitingAccepts]) {
      const session = this.nextFreeSession(entity);
      if (session === undefined) return;
      entity.waitingAccepts.delete(waiting);
      clearTimeout(waiting.timer);
      const settleMode = (waiting.link as unknown as { remote: { attach: { snd_settle_mode: number } } }).remote.attach;
      const receiver: ReceiverLink = { link: waiting.link, entity, peekLock: settleMode.snd_settle_mode !== 1, session: undefined };
      this.lockSession(entity, receiver, waiting.address, session);
      attachState(waiting.link).open_requests = 1;
      entity.receivers.add(receiver);
      (waiting.link.connection as unknown as { _register(): void })._register();
    }
  }

  /** A waiting accept whose client gave up (detached, disconnected) is answered and forgotten. */
  private dropWaitingAccept(link: Sender): void {
    for (const entity of this.allEntities()) {
      for (const waiting of entity.waitingAccepts) {
        if (waiting.link !== link) continue;
        entity.waitingAccepts.delete(waiting);
        clearTimeout(waiting.timer);
        // The attach answer goes out before rhea's detach answer, as AMQP wants.
        attachState(link).open_requests = 1;
      }
    }
  }

  private nextFreeSession(entity: MessageEntity): string | undefined {
    const now = Date.now();
    for (const message of entity.messages) {
      if (message.sessionId === undefined || message.deferred || message.availableAt > now) continue;
      const holder = entity.sessionLocks.get(message.sessionId);
      if (!holder || holder.until <= now || !holder.link.link.is_open()) return message.sessionId;
    }
    return undefined;
  }

  private receiverOf(link: Sender | undefined): ReceiverLink | undefined {
    if (!link) return undefined;
    for (const entity of this.allEntities()) for (const receiver of entity.receivers) if (receiver.link === link) return receiver;
    return undefined;
  }

  private *allEntities(): Iterable<MessageEntity> {
    for (const queue of this.queues.values()) yield* [queue, queue.deadLetterQueue!];
    for (const subscriptions of this.topics.values()) for (const subscription of subscriptions.values()) yield* [subscription, subscription.deadLetterQueue!];
  }

  /** A closed link or connection gives its locked messages back at once (the broker sees the receiver gone). */
  private releaseLink(link: Sender | undefined): void {
    if (link) this.dropWaitingAccept(link);
    const receiver = this.receiverOf(link);
    if (!receiver) return;
    receiver.entity.receivers.delete(receiver);
    if (receiver.session !== undefined && receiver.entity.sessionLocks.get(receiver.session)?.link === receiver) receiver.entity.sessionLocks.delete(receiver.session);
    // Messages whose lock this link held stay locked until the lock expires or is settled
    // through $management, as on Service Bus; but a link's delivery is gone with it. In a
    // session the session lock is what locks its messages: with the session released, they
    // are available again at once, in order, to the session's next receiver.
    for (const message of receiver.entity.messages) {
      if (!message.lock || message.lock.link !== link) continue;
      if (receiver.session !== undefined && message.sessionId === receiver.session) message.lock = undefined;
      else message.lock.delivery = undefined;
    }
    this.pump(receiver.entity);
  }

  private releaseConnection(connection: Connection): void {
    for (const entity of [...this.allEntities()]) {
      for (const waiting of [...entity.waitingAccepts]) {
        if (waiting.link.connection !== connection) continue;
        entity.waitingAccepts.delete(waiting);
        clearTimeout(waiting.timer);
      }
      for (const receiver of [...entity.receivers]) if (receiver.link.connection === connection) this.releaseLink(receiver.link);
    }
  }

  // ---- sending into the broker ------------------------------------------------------------

  private onMessage(context: EventContext): void {
    const link = context.receiver!;
    const delivery = context.delivery!;
    const address = String(link.target?.address ?? '');
    if (address === '$cbs') return this.onCbs(context);
    if (address.endsWith('$management')) return this.onManagement(context, address.slice(0, -'/$management'.length));
    // rhea accepts by default; we answer ourselves.
    // rhea decodes only format 0; a batch (format 0x80013700) arrives as bytes whose data
    // sections are the encoded messages (the SDK's ServiceBusMessageBatch).
    const format = (context as unknown as { format?: number }).format ?? 0;
    const raw = format === 0x80013700 ? (context.message as unknown as Buffer) : (rhea.message.encode(context.message!) as Buffer);
    const messages = format === 0x80013700 ? batchMessages(decode(raw)) : [context.message!];
    const limit = this.config.maxMessageBytes ?? 256 * 1024;
    // A transfer over the entity's maximum message size is refused (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas).
    const refusal = raw.length > limit ? { condition: 'amqp:link:message-size-exceeded', description: `the message is ${raw.length} bytes, over ${limit}` } : this.accept(address, messages);
    if (refusal) delivery.reject(refusal);
    else delivery.accept();
  }

  /** Stores `messages` sent to `path`, all or none; returns why they are refused, if they are. */
  private accept(path: string, messages: Message[], availableAt = Date.now()): { condition: string; description: string } | undefined {
    if (this.throttled.has(path)) {
      // ServiceBusy: https://learn.microsoft.com/azure/service-bus-messaging/service-bus-throttling
      return { condition: 'com.microsoft:server-busy', description: `the stand-in throttles ${path}` };
    }
    const { targets, options } = this.sendTargets(path);
    for (const message of messages) {
      const refused = this.config.refuse?.(message);
      if (refused !== undefined) return { condition: 'amqp:not-allowed', description: refused };
      if (options.requiresSession && (message.group_id === undefined || message.group_id === null)) {
        return { condition: 'amqp:invalid-field', description: `${path} requires a SessionId on every message` };
      }
    }
    for (const message of messages) {
      // Duplicate detection (https://learn.microsoft.com/azure/service-bus-messaging/duplicate-detection):
      // a MessageId seen within the window is accepted and silently dropped.
      if (options.duplicateDetection && message.message_id !== undefined) {
        const seen = this.duplicates.get(path.toLowerCase()) ?? new Map<string, number>();
        this.duplicates.set(path.toLowerCase(), seen);
        const id = String(message.message_id);
        const at = seen.get(id);
        if (at !== undefined && Date.now() - at < options.duplicateWindowMs) continue;
        seen.set(id, Date.now());
      }
      const scheduled = message.message_annotations?.['x-opt-scheduled-enqueue-time'] as Date | number | undefined;
      const at = scheduled === undefined ? availableAt : Math.max(availableAt, new Date(scheduled).getTime());
      for (const target of targets) target.enqueue(message, at, message.group_id === undefined || message.group_id === null ? undefined : String(message.group_id));
    }
    return undefined;
  }

  // ---- delivering to receivers -------------------------------------------------------------

  /** Hands available messages to receivers with credit, oldest first, honouring locks and sessions. */
  private pump(entity: MessageEntity): void {
    if (entity.waitingAccepts.size > 0) this.grantWaitingAccepts(entity);
    const now = Date.now();
    // Receivers take turns (competing consumers share the entity's messages), oldest message first.
    const receivers = [...entity.receivers].filter((receiver) => {
      if (!receiver.link.is_open()) return false;
      if (!entity.options.requiresSession) return true;
      const hold = receiver.session === undefined ? undefined : entity.sessionLocks.get(receiver.session);
      return hold !== undefined && hold.link === receiver && hold.until > now;
    });
    if (receivers.length > 0) {
      for (const message of entity.messages) {
        if (message.lock || message.deferred || message.availableAt > now) continue;
        const count = receivers.length;
        for (let turn = 0; turn < count; turn += 1) {
          const receiver = receivers[(entity.turn + turn) % count]!;
          if (!hasCredit(receiver.link)) continue;
          if (entity.options.requiresSession && message.sessionId !== receiver.session) continue;
          this.deliver(receiver, message);
          entity.turn = (entity.turn + turn + 1) % count;
          break;
        }
      }
    }
    for (const receiver of receivers) this.finishDrain(receiver.link);
  }

  private finishDrain(link: Sender): void {
    const state = link as unknown as { _draining?: boolean; credit: number; connection: { _register(): void } };
    if (!state._draining) return;
    const delay = this.config.drainDelayMs ?? 0;
    if (delay <= 0) return link.set_drained(true);
    // rhea answers a drain by itself at its next write: hold that back (drainDelayMs), then
    // answer and make rhea write (its internal _register schedules the connection's output).
    link.set_drained(false);
    if (this.slowDrains.has(link)) return;
    this.slowDrains.add(link);
    setTimeout(() => {
      this.slowDrains.delete(link);
      if (!link.is_open() || !state._draining) return;
      link.set_drained(true);
      state.connection._register();
    }, delay).unref();
  }

  private deliver(receiver: ReceiverLink, message: StoredMessage): void {
    const entity = receiver.entity;
    // Delivery count (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-dead-letter-queues#maximum-delivery-count):
    // incremented on each delivery; a message that was delivered MaxDeliveryCount times and
    // comes back once more is dead-lettered with MaxDeliveryCountExceeded instead.
    if (message.deliveryCount >= entity.options.maxDeliveryCount && entity.deadLetterQueue) {
      this.moveToDeadLetter(entity, message, 'MaxDeliveryCountExceeded', `Message could not be consumed after ${entity.options.maxDeliveryCount} delivery attempts.`);
      return;
    }
    message.deliveryCount += 1;
    const tokenBytes = randomBytes(16);
    const until = Date.now() + entity.options.lockDurationMs;
    const annotations: Record<string, unknown> = {
      ...(message.body.message_annotations ?? {}),
      'x-opt-sequence-number': rhea.types.wrap_long(message.sequenceNumber),
      'x-opt-enqueued-time': new Date(message.enqueuedAt),
      'x-opt-locked-until': new Date(until),
    };
    delete annotations['x-opt-scheduled-enqueue-time'];
    const applicationProperties: Record<string, unknown> = { ...(message.body.application_properties ?? {}) };
    if (message.deadLetter) {
      if (message.deadLetter.reason !== undefined) applicationProperties['DeadLetterReason'] = message.deadLetter.reason;
      if (message.deadLetter.description !== undefined) applicationProperties['DeadLetterErrorDescription'] = message.deadLetter.description;
      if (message.deadLetter.source !== undefined) annotations['x-opt-deadletter-source'] = message.deadLetter.source;
    }
    const outgoing: Message = { ...message.body, message_annotations: annotations, application_properties: applicationProperties, delivery_count: message.deliveryCount };
    if (!receiver.peekLock) {
      // ReceiveAndDelete: the message is gone once sent.
      entity.remove(message);
      receiver.link.send(outgoing, tokenBytes);
      return;
    }
    const delivery = receiver.link.send(outgoing, tokenBytes);
    message.lock = { token: tokenBytes.toString('hex'), until, link: receiver.link, delivery };
  }

  private moveToDeadLetter(entity: MessageEntity, message: StoredMessage, reason: string | undefined, description: string | undefined): void {
    entity.remove(message);
    const target = entity.deadLetterQueue;
    if (!target) return;
    target.enqueue(message.body, Date.now(), message.sessionId, { reason, description, source: undefined }, message.deliveryCount);
  }

  private expireLocks(): void {
    const now = Date.now();
    for (const entity of this.allEntities()) {
      // Scheduled messages become available with time, not with an event: waiting accepts look again.
      let freed = entity.waitingAccepts.size > 0;
      for (const message of entity.messages) {
        // In a session, messages are locked by the session lock (renewed with it).
        const sessionHold = message.sessionId === undefined ? undefined : entity.sessionLocks.get(message.sessionId);
        if (entity.options.requiresSession && message.lock && sessionHold && sessionHold.link.link === message.lock.link && sessionHold.until > now) continue;
        if (message.lock && message.lock.until <= now) {
          message.lock = undefined;
          freed = true;
        }
      }
      for (const [session, hold] of entity.sessionLocks) {
        if (hold.until <= now) {
          entity.sessionLocks.delete(session);
          // Its messages were locked by the session lock: they go with it.
          for (const message of entity.messages) if (message.sessionId === session && message.lock?.link === hold.link.link) message.lock = undefined;
          // A session receiver whose lock ran out is detached (SessionLockLost on the client).
          hold.link.link.close({ condition: 'com.microsoft:session-lock-lost', description: `the lock on session ${session} expired` });
          freed = true;
        }
      }
      if (freed) this.pump(entity);
    }
  }

  /** The client settled a delivery: complete, abandon, defer or dead-letter (how the SDK encodes them: its messageReceiver.settleMessage). */
  private onDisposition(context: EventContext, outcome: 'accepted' | 'released' | 'rejected'): void {
    const link = context.sender;
    const delivery = context.delivery!;
    const receiver = this.receiverOf(link);
    const entity = receiver?.entity;
    const message = entity?.messages.find((candidate) => candidate.lock?.delivery === delivery);
    const outcomes = rhea.message as unknown as Record<'accepted' | 'released' | 'rejected', (fields?: object) => { described(): unknown }>;
    const answer = (state: unknown) => (delivery as unknown as { update(settled: boolean, state: unknown): void }).update(true, state);
    if (entity && receiver.peekLock && (!message || !this.lockHeld(entity, message))) {
      // The lock ran out (or this delivery's message was settled already): Service Bus
      // refuses the settlement, the SDK throws MessageLockLost, and the message stays (or
      // becomes) available to the next receiver with its delivery count
      // (https://learn.microsoft.com/azure/service-bus-messaging/message-transfers-locks-settlement#peeklock).
      if (message) {
        message.lock = undefined;
        this.pump(entity);
      }
      answer(outcomes.rejected({ error: { condition: 'com.microsoft:message-lock-lost', description: 'The lock supplied is invalid. Either the lock expired, or the message has already been removed from the queue.' } }).described());
      return;
    }
    if (entity && message) {
      const state = (delivery as unknown as { remote_state?: { constructor?: { name?: string }; undeliverable_here?: boolean; message_annotations?: Record<string, unknown>; error?: { condition?: string; info?: Record<string, unknown> } } }).remote_state;
      // Abandon and defer carry propertiesToModify as the modified outcome's message
      // annotations, dead-letter as the error's info (besides reason and description): both
      // update the message's application properties.
      this.settle(entity, message, outcome, state?.undeliverable_here === true, outcome === 'rejected' ? state?.error?.info : state?.message_annotations);
    }
    // Settle with the outcome applied: the SDK waits for this before its settle call resolves.
    answer(outcomes[outcome]({}).described());
  }

  /** Whether `message`'s lock still holds: its own, or in a session its receiver's session lock (renewed with it). */
  private lockHeld(entity: MessageEntity, message: StoredMessage): boolean {
    const lock = message.lock;
    if (!lock) return false;
    const now = Date.now();
    if (lock.until > now) return true;
    const sessionHold = message.sessionId === undefined ? undefined : entity.sessionLocks.get(message.sessionId);
    return entity.options.requiresSession === true && sessionHold !== undefined && sessionHold.link.link === lock.link && sessionHold.until > now;
  }

  /** Applies a settlement (https://learn.microsoft.com/azure/service-bus-messaging/message-transfers-locks-settlement#settling-receive-operations). */
  private settle(entity: MessageEntity, message: StoredMessage, outcome: 'accepted' | 'released' | 'rejected', defer: boolean, modify: Record<string, unknown> | undefined): void {
    message.lock = undefined;
    const info = modify;
    const changes = Object.entries(modify ?? {}).filter(([name]) => name !== 'DeadLetterReason' && name !== 'DeadLetterErrorDescription');
    if (outcome !== 'accepted' && changes.length > 0) {
      // propertiesToModify (https://learn.microsoft.com/dotnet/api/azure.messaging.servicebus.servicebusreceiver.abandonmessageasync).
      message.body = { ...message.body, application_properties: { ...(message.body.application_properties ?? {}), ...Object.fromEntries(changes) } };
    }
    if (outcome === 'accepted') {
      entity.remove(message);
    } else if (outcome === 'rejected') {
      const reason = info?.['DeadLetterReason'];
      const description = info?.['DeadLetterErrorDescription'];
      this.moveToDeadLetter(entity, message, reason === undefined ? undefined : String(reason), description === undefined ? undefined : String(description));
    } else if (defer) {
      message.deferred = true;
    }
    // Abandon: the lock is released and the message is available again, its delivery count kept.
    this.pump(entity);
  }

  private findLocked(entity: MessageEntity, tokenBytes: Buffer): StoredMessage | undefined {
    const direct = tokenBytes.toString('hex');
    const reordered = reorderGuid(tokenBytes).toString('hex');
    return entity.messages.find((message) => message.lock !== undefined && (message.lock.token === direct || message.lock.token === reordered));
  }

  // ---- request / response nodes -------------------------------------------------------------

  private reply(context: EventContext, status: number, body: unknown, description = ''): void {
    const request = context.message!;
    context.delivery?.accept();
    // The reply goes to the client's receiver link whose *name* is the request's reply_to.
    const target = this.replyLinks.get(context.connection)?.get(String(request.reply_to ?? ''));
    if (!target) return;
    target.send({
      correlation_id: request.message_id,
      application_properties: { statusCode: status, 'status-code': status, statusDescription: description, 'status-description': description },
      body,
    });
  }

  private onCbs(context: EventContext): void {
    // CBS put-token: every token is accepted (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-amqp-protocol-guide#claims-based-authorization).
    this.reply(context, 202, undefined, 'Accepted');
  }

  private onManagement(context: EventContext, path: string): void {
    const request = context.message!;
    const operation = String(request.application_properties?.['operation'] ?? '');
    const body = (request.body ?? {}) as Record<string, unknown>;
    // A request names its entity: a queue or subscription not seen yet is created, as on first attach.
    const entity = this.findEntity(path) ?? (/\/subscriptions\//i.test(path) || !this.config.isTopic?.(path) ? this.receivingEntity(path) : undefined);
    const fail = (status: number, condition: string, description: string) => this.replyError(context, status, condition, description);
    try {
      switch (operation) {
        // Request/response operations: https://learn.microsoft.com/azure/service-bus-messaging/service-bus-amqp-request-response
        case 'com.microsoft:renew-lock': {
          if (!entity) return fail(404, 'com.microsoft:message-lock-lost', `no entity ${path}`);
          const tokens = (body['lock-tokens'] as Buffer[] | undefined) ?? [];
          const expirations: Date[] = [];
          for (const token of tokens) {
            const message = this.findLocked(entity, Buffer.from(token));
            if (!message?.lock || message.lock.until <= Date.now()) return fail(410, 'com.microsoft:message-lock-lost', 'the lock was lost or never held');
            message.lock.until = Date.now() + entity.options.lockDurationMs;
            expirations.push(new Date(message.lock.until));
          }
          return this.reply(context, 200, { expirations });
        }
        case 'com.microsoft:renew-session-lock': {
          const session = String(body['session-id'] ?? '');
          const hold = entity?.sessionLocks.get(session);
          if (!entity || !hold || hold.until <= Date.now()) return fail(410, 'com.microsoft:session-lock-lost', `session ${session} is not locked`);
          hold.until = Date.now() + entity.options.lockDurationMs;
          return this.reply(context, 200, { expiration: new Date(hold.until) });
        }
        case 'com.microsoft:peek-message': {
          const from = longOf(body['from-sequence-number']);
          const count = Number(body['message-count'] ?? 1);
          const source = entity ? entity.messages : [];
          const session = body['session-id'] === undefined ? undefined : String(body['session-id']);
          const found = source
            .filter((message) => message.sequenceNumber >= from && (session === undefined || message.sessionId === session))
            .sort((a, b) => a.sequenceNumber - b.sequenceNumber)
            .slice(0, count);
          if (found.length === 0) return this.reply(context, 204, {});
          return this.reply(context, 200, {
            messages: found.map((message) => ({
              message: rhea.message.encode({
                ...message.body,
                delivery_count: message.deliveryCount,
                message_annotations: { ...(message.body.message_annotations ?? {}), 'x-opt-sequence-number': rhea.types.wrap_long(message.sequenceNumber), 'x-opt-enqueued-time': new Date(message.enqueuedAt) },
                application_properties: {
                  ...(message.body.application_properties ?? {}),
                  ...(message.deadLetter?.reason !== undefined ? { DeadLetterReason: message.deadLetter.reason } : {}),
                  ...(message.deadLetter?.description !== undefined ? { DeadLetterErrorDescription: message.deadLetter.description } : {}),
                },
              }),
            })),
          });
        }
        case 'com.microsoft:schedule-message': {
          // Scheduled messages (https://learn.microsoft.com/azure/service-bus-messaging/message-sequencing#scheduled-messages):
          // accepted now, invisible until their ScheduledEnqueueTimeUtc.
          const entries = (body['messages'] as { message: Buffer }[] | undefined) ?? [];
          const sequenceNumbers: unknown[] = [];
          for (const entry of entries) {
            const message = decode(Buffer.from(entry.message));
            const refusal = this.accept(path, [message]);
            if (refusal) return fail(refusal.condition === 'com.microsoft:server-busy' ? 503 : 400, refusal.condition, refusal.description);
            sequenceNumbers.push(rhea.types.wrap_long(this.sequence));
          }
          return this.reply(context, 200, { 'sequence-numbers': rhea.types.wrap_array(sequenceNumbers.map((typed) => (typed as { value: unknown }).value), 0x81, undefined) });
        }
        case 'com.microsoft:update-disposition': {
          // Settling by lock token (after the receiving link is gone, and for session receivers).
          if (!entity) return fail(404, 'amqp:not-found', `no entity ${path}`);
          const status = String(body['disposition-status'] ?? '');
          for (const token of (body['lock-tokens'] as Buffer[] | undefined) ?? []) {
            const message = this.findLocked(entity, Buffer.from(token));
            if (!message?.lock || message.lock.until <= Date.now()) return fail(410, 'com.microsoft:message-lock-lost', 'the lock was lost or never held');
            if (status === 'completed') this.settle(entity, message, 'accepted', false, undefined);
            // Abandon and defer by lock token carry `properties-to-modify` too (the SDK sends it
            // when its receiving link is gone), and they update application properties as on the link.
            else if (status === 'abandoned') this.settle(entity, message, 'released', false, modifications(body));
            else if (status === 'defered' || status === 'deferred') this.settle(entity, message, 'released', true, modifications(body));
            else if (status === 'suspended') this.settle(entity, message, 'rejected', false, { DeadLetterReason: body['deadletter-reason'], DeadLetterErrorDescription: body['deadletter-description'] });
          }
          return this.reply(context, 200, {});
        }
        default:
          return fail(501, 'amqp:not-implemented', `the stand-in does not implement ${operation}`);
      }
    } catch (error) {
      return fail(500, 'amqp:internal-error', error instanceof Error ? error.message : String(error));
    }
  }

  private replyError(context: EventContext, status: number, condition: string, description: string): void {
    const request = context.message!;
    context.delivery?.accept();
    this.replyLinks.get(context.connection)?.get(String(request.reply_to ?? ''))?.send({
      correlation_id: request.message_id,
      application_properties: { statusCode: status, 'status-code': status, statusDescription: description, 'status-description': description, 'error-condition': condition },
      body: undefined,
    });
  }
}

/** The messages of a batch transfer: one encoded message per data section. */
/**
 * Whether a link has credit for one more message. rhea takes a delivery's credit only when
 * it writes the transfer (on the next tick), so `sendable()` stays true for every message
 * handed to it in one pump: the stand-in locked (and counted a delivery of) messages beyond
 * the receiver's credit, which rhea then held back until the next credit came, unlike a
 * broker, which sends only what the receiver asked for. The deliveries rhea still holds for
 * this link count against its credit here.
 */
function hasCredit(link: Sender): boolean {
  if (!link.sendable()) return false;
  const state = link as unknown as { credit: number; session: { outgoing: { next_pending_delivery: number; next_delivery_id: number; deliveries: { by_id(id: number): { link: Sender } | undefined } } } };
  const outgoing = state.session.outgoing;
  let held = 0;
  for (let id = outgoing.next_pending_delivery; id < outgoing.next_delivery_id; id += 1) if (outgoing.deliveries.by_id(id)?.link === link) held += 1;
  return state.credit > held;
}

/** The `properties-to-modify` map of an update-disposition request (absent: none). */
function modifications(body: Record<string, unknown>): Record<string, unknown> | undefined {
  const given = body['properties-to-modify'];
  return given && typeof given === 'object' && !Buffer.isBuffer(given) ? (given as Record<string, unknown>) : undefined;
}

function batchMessages(outer: Message): Message[] {
  const body = outer.body as { multiple?: boolean; content?: unknown; typecode?: number } | Buffer | undefined;
  if (body && typeof body === 'object' && 'content' in body && body.content !== undefined) {
    const sections = body.multiple ? (body.content as Buffer[]) : [body.content as Buffer];
    return sections.map((section) => decode(Buffer.from(section)));
  }
  if (Buffer.isBuffer(body)) return [decode(body)];
  return [];
}

/** rhea's decoder, typed as the message its events carry. */
function decode(buffer: Buffer): Message {
  return rhea.message.decode(buffer) as unknown as Message;
}

/** .NET GUID byte order: the SDK may reorder a lock token's first three groups. */
function reorderGuid(bytes: Buffer): Buffer {
  if (bytes.length !== 16) return bytes;
  const out = Buffer.from(bytes);
  out[0] = bytes[3]!;
  out[1] = bytes[2]!;
  out[2] = bytes[1]!;
  out[3] = bytes[0]!;
  out[4] = bytes[5]!;
  out[5] = bytes[4]!;
  out[6] = bytes[7]!;
  out[7] = bytes[6]!;
  return out;
}

function longOf(value: unknown): number {
  if (Buffer.isBuffer(value)) return Number(value.readBigInt64BE(0));
  if (typeof value === 'number') return value;
  if (typeof value === 'bigint') return Number(value);
  return 0;
}

/** A time as .NET ticks (100 ns since 0001-01-01), as Service Bus sends `locked-until-utc`. */
function toTicks(ms: number): unknown {
  const ticks = BigInt(ms) * 10_000n + TICKS_AT_EPOCH;
  const buffer = Buffer.alloc(8);
  buffer.writeBigInt64BE(ticks);
  return rhea.types.wrap_long(buffer);
}
