import type { ChildProcess } from 'node:child_process';
import type { Envelope, InboxStore, OutboxStore, Transport } from '@courier/core';

/** What every fixture factory receives: a unique id per test, from which names derive. */
export interface FixtureContext {
  /** Unique per test (and stable across a child process started for that test): `t<hex>`, safe in table, queue and topic names. */
  readonly testId: string;
}

/**
 * A store under test: an outbox and an inbox that share one unit-of-work type `Tx`,
 * plus the means to write and read handler effects inside that unit of work.
 *
 * Isolation: everything a fixture creates must be private to `testId` (its own tables,
 * schema or database), so cases can run concurrently against one server.
 */
export interface StoreFixture<Tx> {
  readonly outbox: OutboxStore<Tx>;
  readonly inbox: InboxStore<Tx>;
  /** Runs `work` in a fresh unit of work; commits when it resolves, rolls back when it throws. */
  transaction<T>(work: (tx: Tx) => Promise<T>): Promise<T>;
  /**
   * Runs `work` in a fresh unit of work and commits it like {@link transaction}, but
   * awaits `beforeCommit` inside it once everything it holds has been written (outbox
   * rows inserted, per-key locks taken) and right before it commits, so the suite can
   * hold a producer at its last moment. Stores that write at commit await it before
   * committing.
   */
  transactionHeldBeforeCommit<T>(work: (tx: Tx) => Promise<T>, beforeCommit: () => Promise<void>): Promise<T>;
  /**
   * One unit-of-work object used for several transactions in turn, as an application
   * may: `begin()` opens one with a transaction begun; `rollback(tx)` rolls that
   * transaction back and resolves with the object to use next — `tx` itself with a new
   * transaction begun where the store's unit-of-work object outlives a transaction (a
   * MikroORM EntityManager: `em.rollback()`, then `em.begin()`), else a fresh one;
   * `commit(tx)` commits.
   */
  readonly reusableUnitOfWork: {
    begin(): Promise<Tx>;
    rollback(tx: Tx): Promise<Tx>;
    commit(tx: Tx): Promise<void>;
  };
  /** Writes one effect row `id` inside `tx` (a handler's side effect). */
  recordEffect(tx: Tx, id: string): Promise<void>;
  /** Every committed effect id, in commit order, duplicates included. */
  readEffects(): Promise<readonly string[]>;
  /**
   * Lets the suite make the database unavailable and available again (database restart
   * scenario). Optional: in-memory fixtures simulate it, real ones may restart a server.
   */
  readonly outage?: { begin(): Promise<void>; end(): Promise<void> };
  /**
   * Says where each of `messageIds` is in the store (its outbox row's state, attempts,
   * due time, lease; its inbox record), one line per message found, so a scenario that
   * did not settle can name where an unsettled message is instead of only calling it
   * lost. Diagnostics only, read-only. Optional.
   */
  locate?(messageIds: readonly string[]): Promise<ReadonlyMap<string, string>>;
  /**
   * What the outbox does with a row it completes: `keep` (the default when absent) marks it
   * published and keeps it until `prune`; `delete` deletes it at completion. The cases whose
   * expectation depends on kept published rows (what `prune` finds; whether a published
   * messageId may be appended again) read it, so a store in either mode is held to the right
   * expectation instead of skipping them. Declare it from the store's own setting (for
   * `MikroOrmOutboxStore`, its `publishedRows`).
   */
  readonly outboxPublishedRows?: 'keep' | 'delete';
  /**
   * Lets the suite see the statements the store sends, so the case holding an append to its
   * round trips can count them (a producing transaction pays one round trip per statement).
   * Optional: a fixture whose driver cannot report its statements leaves it out and that case
   * is skipped, saying so.
   */
  readonly statementLog?: StatementLog;
  /** Releases connections. Must not delete what a later `createFixture` with the same testId needs. */
  close(): Promise<void>;
}

/** How a fixture reports the statements its store sends (see {@link StoreFixture.statementLog}). */
export interface StatementLog {
  /**
   * Runs `work` and resolves with the SQL text of every statement sent to the database while
   * it ran, in the order sent (transaction control such as BEGIN and COMMIT may be included;
   * the case leaves it out). Only the suite's own `work` runs meanwhile.
   */
  watch(work: () => Promise<void>): Promise<readonly string[]>;
  /**
   * The most statements, transaction control not counted, one append of keyed rows may send on
   * this database: 1 where the INSERT takes the per-key locks itself (PostgreSQL:
   * `INSERT … SELECT … WHERE <advisory locks>`), 2 where the locks may need a statement of their
   * own (MySQL/MariaDB: the key buckets locked FOR UPDATE before the INSERT, until the engine's
   * MySQL append carries them in the INSERT too). Declare it from the database, not from what
   * the store happens to send.
   */
  readonly keyedAppendStatements: number;
}

/** Creates a store fixture for one test. */
export type StoreFixtureFactory<Tx> = (context: FixtureContext) => Promise<StoreFixture<Tx>>;

/**
 * A transport under test. `transport` is one connection; `connect` opens another to the
 * same broker, as a second process would.
 */
export interface TransportFixture {
  readonly transport: Transport;
  connect(): Promise<Transport>;
  /**
   * Kills a connection as a crash would: no settle, no graceful close. Deliveries it
   * held must be redelivered to other connections. A killed transport must also stop its
   * background loops (pollers, heartbeats, reconnect timers) as a dead process's would:
   * cut its socket (through a `TcpProxy` of its own, or the client's own destroy),
   * then stop the object without settling anything (a `close` that waits for nothing), so
   * the test process is left with nothing running.
   */
  kill(transport: Transport): Promise<void>;
  /**
   * For brokers that live in the test process (see `createIpcBrokerTransportFixture`):
   * serves the broker to a worker process spawned with an IPC channel. Optional.
   */
  hostWorker?(child: ChildProcess): void;
  /**
   * Environment variables a worker process needs to reach the broker, called in the test
   * process for each worker of the process-level scenarios and added to that worker's
   * environment — for what only the parent knows (a port chosen at run time, an in-process
   * broker's capabilities); the worker's `createFixture` reads them. Optional.
   */
  workerEnv?(): Record<string, string>;
  /**
   * Makes the broker unavailable then available again (the in-process `broker-restart`
   * scenario; without it that case is skipped, saying why). The process-level
   * `broker-restart` and `database-restart` cases do not use it: they SIGKILL a worker at
   * that point like the other crash cases. Whole-server restarts are the e2e restart
   * project's. Optional.
   */
  readonly outage?: { begin(): Promise<void>; end(): Promise<void> };
  /**
   * Makes the broker refuse (nack) every later publish of a message for which
   * `predicate` is true, so the suite can check that one refusal never fails its
   * neighbours. What counts is the broker's answer path: `publish` must see that message
   * fail as the broker's refusal (not `validate`, not a client-side check). A broker that
   * cannot refuse by content can be made to by the fixture: a policy (a full queue with
   * reject-publish), a subject or topic no stream takes, or a protocol-level proxy that
   * answers those publishes with the broker's own error reply. Optional: the case is
   * skipped, saying why, when absent.
   */
  rejectPublish?(predicate: (envelope: Envelope) => boolean): Promise<void>;
  /**
   * Returns a copy of `envelope` that the broker itself refuses for its content when it
   * is published — ideally content that `transport.validate` cannot foresee and that
   * hits the broker's worst reaction (RabbitMQ: closing the publish channel) — so the
   * suite can check that such a message fails alone. Synchronous. The copy keeps the
   * envelope's messageId, topic and key (the suite matches results by messageId and checks
   * the key's later messages); change content only: payload, headers. Optional: the case is
   * skipped, saying why, when absent.
   */
  refusable?(envelope: Envelope): Envelope;
  /**
   * Returns a copy of `envelope` that `transport.validate` names at least one problem with
   * (a header name the broker reserves, a topic it cannot name), so the suite can check that
   * `publish` refuses what `validate` refuses, alone, without sending it. Synchronous. The
   * copy keeps the envelope's messageId (results are matched by it) and may change anything
   * else. Optional: for a transport with `validate` the case is skipped, saying why, when
   * absent.
   */
  refusedByValidate?(envelope: Envelope): Envelope;
  /**
   * Puts on the broker, for `topic`, a message that is not a Courier envelope (plain bytes,
   * none of the transport's headers), as another producer or a broken client might, so the
   * suite can check that it never reaches a handler and does not stop the messages after it
   * (the Transport contract's "Receiving"). Optional: the case is skipped, saying why, when
   * absent.
   */
  publishMalformed?(topic: string): Promise<void>;
  /**
   * Makes the next `count` (default 1) settles of `kind` fail at the broker, as a broker
   * failure would: for a transport that writes a copy (a delay-tier or retry-topic publish,
   * a dead-letter publish) the copy's write is refused or fails; for a broker-native settle
   * (a nak, an abandon, a dead-letter disposition, an ack) the call fails. The delivery's
   * settle then rejects. Lets the kit check that a settle that fails neither loses the
   * message nor leaves it in hand for ever.
   */
  failSettles?(kind: 'ack' | 'retry' | 'deadLetter', count?: number): Promise<void>;
  /**
   * Makes the broker deliver a second copy of `envelope`, which the suite has just
   * published through `transport`, to the same consumers (bus scenario
   * `concurrent-duplicate-delivery`). Optional: without it the suite publishes `envelope`
   * again, which is enough for a broker that keeps every publish (RabbitMQ, the in-memory
   * broker). A broker that de-duplicates by messageId — JetStream (`Nats-Msg-Id`), Azure
   * Service Bus duplicate detection, Kafka's idempotent producer — drops that copy, and
   * the scenario fails with "the fault … never happened": its fixture must provide this,
   * e.g. publishing the same envelope under a different broker-level de-duplication id,
   * or with the broker's de-duplication turned off for the test.
   */
  injectDuplicate?(envelope: Envelope): Promise<void>;
  /**
   * Says where each of `messageIds` is in the broker (queued, in flight under a lease,
   * waiting for a retry, dead), one line per message found, for the diagnosis of a
   * scenario that did not settle (see `StoreFixture.locate`). Read-only. Optional.
   */
  locate?(messageIds: readonly string[]): Promise<ReadonlyMap<string, string>>;
  close(): Promise<void>;
}

/** Creates a transport fixture for one test. */
export type TransportFixtureFactory = (context: FixtureContext) => Promise<TransportFixture>;

/**
 * A module that a child process imports to build the same fixtures as the parent
 * (closures cannot cross a process boundary). It must export `createFixture`.
 */
export interface ProcessFixtureModule<Tx> {
  createFixture(context: FixtureContext): Promise<{ store: StoreFixture<Tx>; transport: TransportFixture }>;
}
