import { createHash } from 'node:crypto';
import { ConfigError } from '@courier/core';

/**
 * Where Courier's tables live. Both stores and the migrations take the same value, so
 * they agree on names.
 */
export interface CourierTablesConfig {
  /**
   * Prefix of every table, index and sequence name. Default `courier_`, giving
   * `courier_outbox` and `courier_inbox`. Letters, digits and `_`, at most 32 characters.
   */
  readonly tablePrefix?: string;
  /**
   * PostgreSQL schema or MySQL/MariaDB database holding the tables. Default: the
   * connection's current one. Not supported on SQLite.
   */
  readonly schema?: string;
}

/** The resolved names of every database object Courier uses (unquoted). */
export interface CourierTableNames {
  readonly prefix: string;
  readonly schema: string | undefined;
  /** Messages to publish. */
  readonly outbox: string;
  /** Processed (messageId, consumer) pairs. */
  readonly inbox: string;
  /** Handler start counts (crash-loop detection). */
  readonly inboxStarts: string;
  /** Halted ordered keys of inbox consumers (`poison: 'halt'`), with their heads. */
  readonly inboxHalts: string;
  /** Messages held behind an inbox halt. */
  readonly inboxHeld: string;
  /** Heads parked by resuming an inbox halt with `park`. */
  readonly inboxParked: string;
  /** Key/value rows: the schema version and, where there is no sequence object, the lease token counter. */
  readonly meta: string;
  /** MySQL/MariaDB: fixed lock rows, one per key bucket, taken to serialise appends of one key. */
  readonly outboxLocks: string;
  /** PostgreSQL: the sequence fencing tokens come from. */
  readonly tokenSequence: string;
  /** PostgreSQL: the LISTEN/NOTIFY channel of this outbox. */
  readonly channel: string;
  /** PostgreSQL: the advisory lock namespace of this outbox (first key of the two-int form). */
  readonly lockNamespace: number;
}

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*$/;
const MAX_PREFIX = 32;

/**
 * Resolves and validates table names; throws a `ConfigError` listing every problem.
 */
export function resolveTableNames(config: CourierTablesConfig = {}): CourierTableNames {
  const prefix = config.tablePrefix ?? 'courier_';
  const problems: string[] = [];
  if (!IDENTIFIER.test(prefix)) {
    problems.push(`'tablePrefix' must start with a letter or '_' and contain only letters, digits and '_', got ${JSON.stringify(prefix)}`);
  }
  if (prefix.length > MAX_PREFIX) problems.push(`'tablePrefix' is longer than ${MAX_PREFIX} characters`);
  if (config.schema !== undefined && !IDENTIFIER.test(config.schema)) {
    problems.push(`'schema' must be a plain identifier (letters, digits, '_'), got ${JSON.stringify(config.schema)}`);
  }
  if (problems.length > 0) throw new ConfigError(problems);
  const qualified = `${config.schema ?? ''}.${prefix}outbox`;
  const digest = createHash('sha256').update(qualified).digest();
  // PostgreSQL truncates channel names to 63 bytes; a hash keeps distinct outboxes apart.
  const channel = `courier_${digest.subarray(0, 8).toString('hex')}`;
  return {
    prefix,
    schema: config.schema,
    outbox: `${prefix}outbox`,
    inbox: `${prefix}inbox`,
    inboxStarts: `${prefix}inbox_starts`,
    inboxHalts: `${prefix}inbox_halts`,
    inboxHeld: `${prefix}inbox_held`,
    inboxParked: `${prefix}inbox_parked`,
    meta: `${prefix}meta`,
    outboxLocks: `${prefix}outbox_locks`,
    tokenSequence: `${prefix}outbox_token_seq`,
    channel,
    lockNamespace: digest.readInt32BE(8),
  };
}
