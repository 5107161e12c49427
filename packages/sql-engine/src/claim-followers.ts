import { ageSql, qualifiedColumns, unleasedSql, type ClaimQuery, type SqlDialect } from './dialects/sql-dialect.js';
import { toBigInt, toNumber, type SqlRow, type SqlExecutor } from './executor.js';

/** What {@link claimFollowers} extends: the heads one claim leased, its token, and how many more rows it may take. */
export interface FollowerClaim {
  /** Sequences (as strings) of the keyed heads the claim leased. */
  readonly heads: readonly string[];
  /** The lease token the heads were claimed under; the followers get the same one. */
  readonly token: bigint;
  /** Most followers to take, over all keys (the claim's limit minus its heads). */
  readonly room: number;
  /** Most rows of one key in the batch, the head included. */
  readonly perKey: number;
}

/**
 * The second step of a pipelined claim (`perKey > 1`): after the one-statement head claim
 * committed, leases up to `perKey - 1` rows right behind each of its heads under the SAME
 * lease (owner, token, expiry from now), in a transaction of its own. Returns the rows
 * leased (row columns and `age_ms`, any order); the heads are not among them.
 *
 * Guarantees:
 * - A head's followers are taken only while this transaction holds the head locked and the
 *   head is still pending under `token` with its lease unexpired: a head another relay
 *   re-claimed, or this relay completed, failed or released meanwhile, gets no followers.
 * - A key's followers are contiguous: ascending sequence from the head, each pending, due,
 *   not held by a live lease and locked here; the run ends at the first row that is not
 *   (a halted row, a scheduled or in-flight row, a row another transaction holds). Dead and
 *   published rows are not part of a key's order and are passed over, as by the head claim.
 * - Every lock is taken with SKIP LOCKED and every row updated is locked first, so this
 *   transaction never waits for a row lock; it draws no token and takes no counter row.
 * - Fencing: `token` was drawn by a claim that committed before this transaction locked
 *   the followers, and a follower is only ever leased behind a head its lease holds, so
 *   `token` is greater than any lease a follower carried before.
 * - At most `room` rows in all; when the runs do not fit, each key gets its first follower
 *   before any key gets its second.
 */
export async function claimFollowers<Tx>(dialect: SqlDialect, runner: SqlExecutor<Tx>, query: ClaimQuery, claim: FollowerClaim): Promise<SqlRow[]> {
  if (claim.heads.length === 0 || claim.room < 1 || claim.perKey < 2) return [];
  return dialect.name === 'postgresql' ? claimFollowersPostgres(dialect, runner, query, claim) : claimFollowersLocked(dialect, runner, query, claim);
}

/** PostgreSQL: one statement (heads locked, runs read, followers locked, leased, returned). */
async function claimFollowersPostgres<Tx>(dialect: SqlDialect, runner: SqlExecutor<Tx>, query: ClaimQuery, claim: FollowerClaim): Promise<SqlRow[]> {
  const outbox = dialect.table('outbox');
  // MATERIALIZED: each locking CTE runs once, whole, before what reads it. A row changed
  // after the statement's snapshot is re-checked against its CTE's WHERE when locked
  // (READ COMMITTED), so a head no longer held, or a follower no longer pending and due,
  // drops out there, and the run stops before it (the window's running AND).
  const sql =
    `WITH heads AS MATERIALIZED (SELECT o.seq, o.key_hash FROM ${outbox} o ` +
    `WHERE o.seq IN (?) AND o.key_hash IS NOT NULL AND o.state = 'pending' AND o.lease_token = ? AND o.leased_until > now()${dialect.lockSkipLocked}), ` +
    // One ordered, LIMITed range of the (key_hash, seq) pending-or-halted index per head.
    // The row comparison (not `x.seq > h.seq`) keeps the primary key out of it: with few
    // keys the planner would walk the seq index behind the head and filter by key (every
    // row of the backlog between two followers; measured 50-90 ms for 20 heads of 80).
    `candidates AS (SELECT f.seq, f.key_hash, (f.state = 'pending' AND f.available_at <= now() AND ${unleasedSql('f.', 'now()')}) AS ok FROM heads h CROSS JOIN LATERAL ` +
    `(SELECT x.seq, x.key_hash, x.state, x.available_at, x.leased_until FROM ${outbox} x WHERE x.key_hash = h.key_hash AND (x.key_hash, x.seq) > (h.key_hash, h.seq) ` +
    `AND x.state IN ('pending', 'halted') ORDER BY x.key_hash, x.seq LIMIT ?) f), ` +
    `runs AS MATERIALIZED (SELECT seq, key_hash FROM (SELECT seq, key_hash, row_number() OVER w AS pos, bool_and(ok) OVER w AS contiguous FROM candidates ` +
    `WINDOW w AS (PARTITION BY key_hash ORDER BY seq)) c WHERE contiguous ORDER BY pos, seq LIMIT ?), ` +
    `locked AS MATERIALIZED (SELECT o.seq, ${ageSql(dialect, 'o')} FROM ${outbox} o ` +
    `WHERE o.seq IN (SELECT seq FROM runs) AND o.state = 'pending' AND o.available_at <= now() AND ${unleasedSql('o.', 'now()')}${dialect.lockSkipLocked}), ` +
    `chosen AS (SELECT seq, age_ms FROM (SELECT r.seq, l.age_ms, bool_and(l.seq IS NOT NULL) OVER (PARTITION BY r.key_hash ORDER BY r.seq) AS held ` +
    `FROM runs r LEFT JOIN locked l ON l.seq = r.seq) t WHERE held) ` +
    `UPDATE ${outbox} u SET lease_owner = ?, lease_token = ?, leased_until = ${dialect.plusMs('now()')} ` +
    `FROM chosen WHERE u.seq = chosen.seq RETURNING ${qualifiedColumns('u')}, chosen.age_ms`;
  const token = claim.token.toString();
  return runner.all(sql, [claim.heads, token, Math.min(claim.perKey - 1, claim.room), claim.room, query.owner, token, query.leaseMs]);
}

/**
 * MySQL/MariaDB and SQLite: one short transaction. The heads still held are locked first
 * (by primary key, SKIP LOCKED), then the runs behind them are read without locks, then
 * the followers are locked by primary key (ascending, SKIP LOCKED), which re-checks each;
 * only rows locked here are updated. SQLite holds the write lock from the transaction's
 * start instead. On InnoDB these locking reads take clustered records only (no secondary
 * index entry a head scan could be waiting for), and the transaction never touches the
 * token's counter row, so it adds no lock cycle with the head claims (rows, then counter).
 */
async function claimFollowersLocked<Tx>(dialect: SqlDialect, runner: SqlExecutor<Tx>, query: ClaimQuery, claim: FollowerClaim): Promise<SqlRow[]> {
  const outbox = dialect.table('outbox');
  return runner.transaction(
    async (trx) => {
      const heads = await runner.all(
        `SELECT o.seq, o.key_hash FROM ${outbox} o WHERE o.seq IN (?) AND o.key_hash IS NOT NULL AND o.state = 'pending' AND o.lease_token = ? ` +
          `AND o.leased_until > ${dialect.now} ORDER BY o.seq${dialect.lockSkipLocked}`,
        [claim.heads, claim.token.toString()],
        trx,
      );
      if (heads.length === 0) return [];
      // One ordered, LIMITed range of the (key_hash, state, seq) index per head, and the
      // halted rows of those keys (a halted row behind a head ends its run).
      const parts = heads.map(
        (_, index) =>
          `SELECT * FROM (SELECT seq, key_hash, CASE WHEN available_at <= ${dialect.now} AND ${unleasedSql('', dialect.now)} THEN 1 ELSE 0 END AS due FROM ${outbox} ` +
          `WHERE key_hash = ? AND state = 'pending' AND seq > ? ORDER BY seq LIMIT ?) AS run${index}`,
      );
      const perHead = Math.min(claim.perKey - 1, claim.room);
      const keys = heads.map((row) => String(row['key_hash']));
      const candidates = await runner.all(
        [...parts, `SELECT seq, key_hash, 0 AS due FROM ${outbox} WHERE key_hash IN (?) AND state = 'halted'`].join(' UNION ALL '),
        [...heads.flatMap((row) => [String(row['key_hash']), String(row['seq']), perHead]), keys],
        trx,
      );
      const runs = contiguousRuns(
        candidates.map((row) => ({ key: String(row['key_hash']), seq: toBigInt(row['seq']), ok: toNumber(row['due']) === 1 })),
        claim.room,
      );
      if (runs.size === 0) return [];
      const locked = await runner.all(
        `SELECT ${qualifiedColumns('o')}, ${ageSql(dialect, 'o')} FROM ${outbox} o WHERE o.seq IN (?) AND o.state = 'pending' AND o.available_at <= ${dialect.now} ` +
          `AND ${unleasedSql('o.', dialect.now)} ORDER BY o.seq${dialect.lockSkipLocked}`,
        [[...runs.values()].flat()],
        trx,
      );
      const bySeq = new Map(locked.map((row) => [String(row['seq']), row]));
      const rows: SqlRow[] = [];
      for (const run of runs.values()) {
        for (const seq of run) {
          const row = bySeq.get(seq);
          if (row === undefined) break;
          rows.push(row);
        }
      }
      if (rows.length === 0) return [];
      await runner.run(
        `UPDATE ${outbox} SET lease_owner = ?, lease_token = ?, leased_until = ${dialect.plusMs(dialect.now)} WHERE seq IN (?)`,
        [query.owner, claim.token.toString(), query.leaseMs, rows.map((row) => String(row['seq']))],
        trx,
      );
      return rows;
    },
    { readCommitted: dialect.readCommitted },
  );
}

/**
 * Per key, the sequences (strings) of the longest prefix of `candidates` (ascending
 * sequence) whose rows are all `ok`, cut to `room` rows in all: first followers of every
 * key before second ones. Keys with an empty run are left out.
 */
export function contiguousRuns(candidates: readonly { key: string; seq: bigint; ok: boolean }[], room: number): Map<string, string[]> {
  const byKey = new Map<string, { seq: bigint; ok: boolean }[]>();
  for (const row of candidates) {
    const rows = byKey.get(row.key);
    if (rows === undefined) byKey.set(row.key, [row]);
    else rows.push(row);
  }
  const prefixes: (readonly [string, string[]])[] = [];
  for (const [key, rows] of byKey) {
    rows.sort((a, b) => (a.seq < b.seq ? -1 : a.seq > b.seq ? 1 : 0));
    const prefix: string[] = [];
    for (const row of rows) {
      if (!row.ok) break;
      prefix.push(row.seq.toString());
    }
    if (prefix.length > 0) prefixes.push([key, prefix]);
  }
  const runs = new Map<string, string[]>();
  let left = room;
  for (let position = 0; left > 0; position += 1) {
    let took = false;
    for (const [key, prefix] of prefixes) {
      const seq = prefix[position];
      if (seq === undefined || left === 0) continue;
      const run = runs.get(key);
      if (run === undefined) runs.set(key, [seq]);
      else run.push(seq);
      left -= 1;
      took = true;
    }
    if (!took) break;
  }
  return runs;
}
