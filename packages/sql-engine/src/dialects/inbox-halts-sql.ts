import { createHash } from 'node:crypto';
import type { DialectName, SqlDialect } from './sql-dialect.js';

/**
 * The inbox halt tables (schema version 3) and the per-dialect bits their statements need.
 *
 * - `inbox_halts`: one row per halted (consumer, topic, key), keyed by `halt_id` (a SHA-256
 *   of the three, so the primary key fits MySQL's index limit whatever the key's length):
 *   the head (envelope as JSON text, error; NULL once a resume dealt with it), when it
 *   halted, the operator's resume action, and the drain lease (owner, until, length).
 * - `inbox_held`: messages held behind a halt, in arrival order (`seq`), unique per
 *   (consumer, message_id) so a copy or a retry after a crash is held once.
 * - `inbox_parked`: heads parked by a resume, for operators to list.
 *
 * Concurrency: a hold locks the halt row for share and a lift locks it for update before
 * counting held rows, so a lift never deletes a halt a concurrent hold is inserting behind
 * (SQLite: every store transaction takes the write lock first).
 */
export interface HaltSql {
  readonly forShare: string;
  readonly forUpdate: string;
  /** `INSERT … ` that does nothing on a unique conflict: the prefix and the suffix. */
  readonly insertIgnore: { readonly prefix: string; readonly suffix: string };
  schema(): string[];
  drop(): string[];
}

/** The halt row id of (consumer, topic, key). */
export function haltId(consumer: string, topic: string, key: string): string {
  return createHash('sha256').update(`${consumer}\u0000${topic}\u0000${key}`).digest('hex');
}

type Types = { id: string; text: string; ts: string; seq: string; table: string };

const TYPES: Record<DialectName, Types> = {
  postgresql: { id: 'varchar(1024)', text: 'text', ts: 'timestamptz', seq: 'bigserial PRIMARY KEY', table: '' },
  // Binary strings, as the other id columns of schema version 2: compared byte for byte.
  mysql: { id: 'VARBINARY(4096)', text: 'LONGTEXT', ts: 'DATETIME(3)', seq: 'BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY', table: ' ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin' },
  sqlite: { id: 'TEXT', text: 'TEXT', ts: 'INTEGER', seq: 'INTEGER PRIMARY KEY AUTOINCREMENT', table: '' },
};

export function haltSql(dialect: Pick<SqlDialect, 'name' | 'table' | 'quote'>, prefix: string): HaltSql {
  const t = TYPES[dialect.name];
  const halts = dialect.table('inboxHalts');
  const held = dialect.table('inboxHeld');
  const parked = dialect.table('inboxParked');
  const ix = (name: string) => dialect.quote(`${prefix}${name}`);
  // MySQL has no CREATE INDEX IF NOT EXISTS before 8.0.29/MariaDB 10.5... MariaDB has it; keys inline there instead.
  const inlineKeys = dialect.name === 'mysql';
  return {
    forShare: dialect.name === 'postgresql' ? ' FOR SHARE' : dialect.name === 'mysql' ? ' LOCK IN SHARE MODE' : '',
    forUpdate: dialect.name === 'sqlite' ? '' : ' FOR UPDATE',
    insertIgnore:
      dialect.name === 'mysql' ? { prefix: 'INSERT IGNORE INTO', suffix: '' } : { prefix: 'INSERT INTO', suffix: ' ON CONFLICT DO NOTHING' },
    schema: () => [
      `CREATE TABLE IF NOT EXISTS ${halts} (
        halt_id char(64) NOT NULL PRIMARY KEY,
        consumer ${t.id} NOT NULL,
        topic ${t.id} NOT NULL,
        msg_key ${t.id} NOT NULL,
        head_id ${t.id} NULL,
        head_envelope ${t.text} NULL,
        head_error ${t.text} NULL,
        halted_at ${t.ts} NOT NULL,
        resumed varchar(5) NULL,
        drain_owner varchar(200) NULL,
        drain_until ${t.ts} NULL,
        lease_ms bigint NULL${inlineKeys ? `,\n        KEY ${ix('inbox_halts_consumer_ix')} (consumer(200), halted_at)` : ''}
      )${t.table}`,
      ...(inlineKeys ? [] : [`CREATE INDEX IF NOT EXISTS ${ix('inbox_halts_consumer_ix')} ON ${halts} (consumer, halted_at)`]),
      `CREATE TABLE IF NOT EXISTS ${held} (
        seq ${t.seq},
        halt_id char(64) NOT NULL,
        consumer ${dialect.name === 'mysql' ? 'VARBINARY(800)' : t.id} NOT NULL,
        message_id ${dialect.name === 'mysql' ? 'VARBINARY(800)' : t.id} NOT NULL,
        envelope ${t.text} NOT NULL,
        held_at ${t.ts} NOT NULL${
          inlineKeys
            ? `,\n        UNIQUE KEY ${ix('inbox_held_message_uq')} (consumer, message_id),\n        KEY ${ix('inbox_held_halt_ix')} (halt_id, seq)`
            : ''
        }
      )${t.table}`,
      ...(inlineKeys
        ? []
        : [
            `CREATE UNIQUE INDEX IF NOT EXISTS ${ix('inbox_held_message_uq')} ON ${held} (consumer, message_id)`,
            `CREATE INDEX IF NOT EXISTS ${ix('inbox_held_halt_ix')} ON ${held} (halt_id, seq)`,
          ]),
      `CREATE TABLE IF NOT EXISTS ${parked} (
        seq ${t.seq},
        consumer ${t.id} NOT NULL,
        message_id ${t.id} NOT NULL,
        envelope ${t.text} NOT NULL,
        error ${t.text} NOT NULL,
        parked_at ${t.ts} NOT NULL
      )${t.table}`,
    ],
    drop: () => [`DROP TABLE IF EXISTS ${halts}`, `DROP TABLE IF EXISTS ${held}`, `DROP TABLE IF EXISTS ${parked}`],
  };
}
