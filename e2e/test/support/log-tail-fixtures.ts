// The bus suite with the relay tailing PostgreSQL's log: the PostgreSQL store fixture of the
// other e2e suites, its outbox wrapped in `PgLogicalOutboxStore` on a slot private to the
// test (`<prefix><testId>`). The slot exists from the fixture's creation on, so the traffic a
// scenario commits before its workers start is read from the log, not only swept.
//
// Process scenarios: the parent and every worker process build this fixture; each worker's
// store reads the one slot in turn (PostgreSQL streams a slot to one connection; the others
// claim as polling relays, fenced by leases, and take the slot over when its reader dies).
import type { FixtureContext, StoreFixture } from '@courier/conformance';
import { MikroOrmOutboxStore } from '@courier/mikro-orm';
import { dropReplicationSlot, ensureReplicationSlot, PgLogicalOutboxStore } from '@courier/pg-logical';
import type { EntityManager } from '@mikro-orm/core';
import pg from 'pg';
import { createPostgresFixture } from './fixtures.js';

const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://courier:courier@127.0.0.1:5432/courier_test';

/**
 * How often the log-tail store sweeps the table (rows the log does not announce: retries,
 * rows released or left by a crashed relay of the same process). Short, as the scenarios'
 * 1.5 s lease is.
 */
const SWEEP_INTERVAL_MS = 1_000;

/** Rows each in-process fixture's store claimed from the log and by sweep, read at its close (the test files print the sums). */
export const claimTally = { logged: 0, swept: 0 };

/** A store fixture whose outbox tails the log (see {@link logTailStore}). */
export interface LogTailStoreFixture extends StoreFixture<EntityManager> {
  readonly outbox: PgLogicalOutboxStore<EntityManager>;
  readonly slot: string;
  /** Another log-tail store on the same slot and tables (another relay's), closed by `close()`. */
  another(): PgLogicalOutboxStore<EntityManager>;
}

/**
 * A PostgreSQL store fixture whose outbox tails the log. `slotPrefix` names the test file's
 * slots (lower-case letters, digits, `_`), so its `dropLogTailSlots` never touches another
 * file's. With `readAtOnce` the store starts reading the slot before the fixture is returned
 * (until another reader holds it, at most 15 s): a relay that only starts reading at its first
 * claim drains a scenario's small traffic as a polling relay meanwhile, and the log path would
 * hardly be exercised. Not for the parent of process scenarios, which must leave the slot to
 * its workers. `close()` closes the log-tail store and drops the slot when nobody reads it.
 */
export async function logTailStore(context: FixtureContext, slotPrefix: string, options: { readonly readAtOnce: boolean }): Promise<LogTailStoreFixture> {
  const fixture = await createPostgresFixture(context);
  const slot = `${slotPrefix}${context.testId}`.toLowerCase();
  const publication = `${slot}_pub`;
  const admin = new pg.Pool({ connectionString: PG_URL, max: 1 });
  // An idle connection the server ends (the restart project stops PostgreSQL) must not be an uncaught error; the next query reconnects.
  admin.on('error', () => undefined);
  try {
    await ensureReplicationSlot(admin, { slot, publication, table: fixture.table('outbox') });
  } catch (error) {
    await admin.end();
    await fixture.close();
    throw error;
  }
  const open = (store: MikroOrmOutboxStore) =>
    new PgLogicalOutboxStore<EntityManager>({
      store,
      connection: { connectionString: PG_URL },
      slot,
      publication,
      tables: { tablePrefix: fixture.tablePrefix },
      sweepIntervalMs: SWEEP_INTERVAL_MS,
    });
  const outbox = open(fixture.outbox);
  const others: PgLogicalOutboxStore<EntityManager>[] = [];
  if (options.readAtOnce) {
    await outbox.watch(() => undefined);
    const deadline = Date.now() + 15_000;
    while (!outbox.streaming && Date.now() < deadline) {
      // Another worker's store reads it: this one claims as a polling relay until it can take the slot over.
      if ((await outbox.slotStats())?.active) break;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }
  return {
    ...fixture,
    outbox,
    slot,
    another() {
      const store = open(new MikroOrmOutboxStore({ orm: fixture.orm, tablePrefix: fixture.tablePrefix, wakeups: false }));
      others.push(store);
      return store;
    },
    async close() {
      // Closes the wrapped store too.
      await outbox.close();
      for (const other of others) await other.close();
      claimTally.logged += outbox.claimed.logged;
      claimTally.swept += outbox.claimed.swept;
      // The slot's reader (if it was this store) ends a moment after its connection closes.
      for (let attempt = 0; attempt < 20; attempt++) {
        const { rows } = await admin.query<{ active: boolean }>('SELECT active FROM pg_replication_slots WHERE slot_name = $1', [slot]).catch(() => ({ rows: [{ active: true }] }));
        if (rows.length === 0) break;
        if (!rows[0]!.active) {
          await dropReplicationSlot(admin, slot, { publication }).catch(() => undefined);
          break;
        }
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      await admin.end();
      await fixture.close();
    },
  };
}

/**
 * Drops every slot (and its publication) named `<slotPrefix>…` that nobody reads, waiting a
 * while for readers to go; for the test file's `afterAll` (a killed worker's slot may have
 * outlived every fixture's close).
 */
export async function dropLogTailSlots(slotPrefix: string): Promise<void> {
  const admin = new pg.Pool({ connectionString: PG_URL, max: 1 });
  admin.on('error', () => undefined);
  try {
    for (let attempt = 0; attempt < 50; attempt++) {
      const { rows } = await admin.query<{ slot_name: string; active: boolean }>('SELECT slot_name, active FROM pg_replication_slots WHERE starts_with(slot_name, $1)', [slotPrefix]);
      for (const row of rows) if (!row.active) await dropReplicationSlot(admin, row.slot_name, { publication: `${row.slot_name}_pub` }).catch(() => undefined);
      if (rows.every((row) => !row.active)) return;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  } finally {
    await admin.end();
  }
}
