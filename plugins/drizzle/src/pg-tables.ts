import { resolveTableNames, type CourierTablesConfig } from '@courier/sql-engine';
import { sql } from 'drizzle-orm';
import { bigint, bigserial, char, index, integer, pgSchema, pgSequence, pgTable, primaryKey, text, timestamp, unique, uniqueIndex, varchar } from 'drizzle-orm/pg-core';

/**
 * Courier's PostgreSQL tables as Drizzle definitions, for an application that manages its
 * schema with drizzle-kit: spread them into the schema drizzle-kit reads
 * (`export const courier = courierPgTables()` in a schema file, then `drizzle-kit generate`).
 *
 * Guarantees: for the same `tablePrefix`/`schema`, every table has exactly the columns
 * `ensureSchema()` creates (name, type, NOT NULL, whether it has a default; checked by this
 * package's tests against the database), the same primary keys, unique constraints and
 * indexes (partial ones with their conditions), and the token sequence. Not expressible in
 * Drizzle and so left to you: the outbox's storage parameters (`fillfactor = 50`, which gives
 * the lease version of a row room on its page, schema version 7, and
 * `autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000`) and the
 * `schema_version` row of the meta table, which `ensureSchema()` (idempotent) adds; run it once
 * after migrating, or the stores report the schema as missing.
 */
export function courierPgTables(config: CourierTablesConfig = {}) {
  const n = resolveTableNames(config);
  const schema = n.schema === undefined ? undefined : pgSchema(n.schema);
  const table = (schema?.table ?? pgTable) as typeof pgTable;
  const sequence = (schema?.sequence ?? pgSequence) as typeof pgSequence;
  const ts = (name: string) => timestamp(name, { withTimezone: true });
  const id = (name: string) => varchar(name, { length: 1024 });
  const ix = (suffix: string) => `${n.outbox}_${suffix}`;
  return {
    outbox: table(
      n.outbox,
      {
        seq: bigserial('seq', { mode: 'bigint' }).primaryKey(),
        messageId: varchar('message_id', { length: 200 }).notNull(),
        messageType: varchar('message_type', { length: 200 }).notNull(),
        messageVersion: integer('message_version').notNull(),
        topic: varchar('topic', { length: 249 }).notNull(),
        msgKey: varchar('msg_key', { length: 1024 }),
        keyHash: char('key_hash', { length: 32 }),
        occurredAt: varchar('occurred_at', { length: 32 }).notNull(),
        correlationId: varchar('correlation_id', { length: 200 }).notNull(),
        causationId: varchar('causation_id', { length: 200 }),
        traceparent: varchar('traceparent', { length: 55 }),
        tracestate: varchar('tracestate', { length: 512 }),
        headers: text('headers').notNull(),
        payload: text('payload').notNull(),
        state: varchar('state', { length: 9 }).notNull().default('pending'),
        availableAt: ts('available_at').notNull(),
        attempts: integer('attempts').notNull().default(0),
        lastError: text('last_error'),
        failedAt: ts('failed_at'),
        // Schema version 5: a dead row's error code and class, and when it first failed.
        errorCode: varchar('error_code', { length: 64 }),
        errorName: varchar('error_name', { length: 200 }),
        firstFailedAt: ts('first_failed_at'),
        // Schema version 6: when the row first became due (stats' oldest pending age).
        firstDueAt: ts('first_due_at'),
        leaseOwner: varchar('lease_owner', { length: 200 }),
        leaseToken: bigint('lease_token', { mode: 'bigint' }),
        createdAt: ts('created_at').notNull().defaultNow(),
        publishedAt: ts('published_at'),
        // Schema version 7: the end of the row's lease (a claim changes no indexed column).
        leasedUntil: ts('leased_until'),
      },
      (t) => [
        unique(ix('message_id_uq')).on(t.messageId),
        index(ix('due_ix')).on(t.availableAt, t.seq).where(sql`state = 'pending'`),
        index(ix('key_ix')).on(t.keyHash, t.seq).where(sql`state IN ('pending', 'halted')`),
        index(ix('failed_ix')).on(t.seq).where(sql`state IN ('dead', 'halted')`),
        index(ix('published_ix')).on(t.publishedAt).where(sql`state = 'published'`),
      ],
    ),
    tokenSequence: sequence(n.tokenSequence),
    inbox: table(
      n.inbox,
      {
        messageId: varchar('message_id', { length: 200 }).notNull(),
        consumer: varchar('consumer', { length: 200 }).notNull(),
        processedAt: ts('processed_at').notNull().defaultNow(),
      },
      (t) => [primaryKey({ columns: [t.messageId, t.consumer] }), index(`${n.inbox}_processed_ix`).on(t.processedAt)],
    ),
    inboxStarts: table(
      n.inboxStarts,
      {
        messageId: varchar('message_id', { length: 200 }).notNull(),
        consumer: varchar('consumer', { length: 200 }).notNull(),
        starts: integer('starts').notNull(),
        updatedAt: ts('updated_at').notNull(),
      },
      (t) => [primaryKey({ columns: [t.messageId, t.consumer] }), index(`${n.inboxStarts}_updated_ix`).on(t.updatedAt)],
    ),
    inboxHalts: table(
      n.inboxHalts,
      {
        haltId: char('halt_id', { length: 64 }).primaryKey(),
        consumer: id('consumer').notNull(),
        topic: id('topic').notNull(),
        msgKey: id('msg_key').notNull(),
        headId: id('head_id'),
        headEnvelope: text('head_envelope'),
        headError: text('head_error'),
        haltedAt: ts('halted_at').notNull(),
        resumed: varchar('resumed', { length: 5 }),
        drainOwner: varchar('drain_owner', { length: 200 }),
        drainUntil: ts('drain_until'),
        leaseMs: bigint('lease_ms', { mode: 'number' }),
      },
      (t) => [index(`${n.prefix}inbox_halts_consumer_ix`).on(t.consumer, t.haltedAt)],
    ),
    inboxHeld: table(
      n.inboxHeld,
      {
        seq: bigserial('seq', { mode: 'bigint' }).primaryKey(),
        haltId: char('halt_id', { length: 64 }).notNull(),
        consumer: id('consumer').notNull(),
        messageId: id('message_id').notNull(),
        envelope: text('envelope').notNull(),
        heldAt: ts('held_at').notNull(),
      },
      (t) => [uniqueIndex(`${n.prefix}inbox_held_message_uq`).on(t.consumer, t.messageId), index(`${n.prefix}inbox_held_halt_ix`).on(t.haltId, t.seq)],
    ),
    inboxParked: table(n.inboxParked, {
      seq: bigserial('seq', { mode: 'bigint' }).primaryKey(),
      consumer: id('consumer').notNull(),
      messageId: id('message_id').notNull(),
      envelope: text('envelope').notNull(),
      error: text('error').notNull(),
      parkedAt: ts('parked_at').notNull(),
    }),
    meta: table(n.meta, {
      name: varchar('name', { length: 64 }).primaryKey(),
      value: bigint('value', { mode: 'bigint' }).notNull(),
    }),
  };
}
