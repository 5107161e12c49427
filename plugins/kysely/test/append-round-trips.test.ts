// The conformance kit's round-trip case on Kysely over PostgreSQL (a keyed publish and a
// three-row keyed append send one statement, the INSERT that takes the per-key advisory lock
// itself; order kept; a duplicate messageId refused). The suite's fixture is wrapped rather
// than changed: the case's publishes run on a second Kysely over the same tables whose `log`
// records every statement it sends (Kysely logs only at construction), so the kit can count
// them. test/append-statements.test.ts holds the same by hand; once the suite fixture reports
// statements itself (statementLog), the kit's conformance run covers it and both can go.
import { describeOutboxStoreCases, outboxRoundTripCaseName, type StoreFixture } from '@courier/conformance';
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { KyselyOutboxStore } from '../src/index.js';
import { createKyselyFixture, PG_URL, type AnyDb, type Trx } from './support/fixture.js';

describeOutboxStoreCases('kysely:postgresql', async (context): Promise<StoreFixture<Trx>> => {
  const base = await createKyselyFixture('postgresql', context);
  let watched: string[] | undefined;
  const logged = new Kysely<AnyDb>({
    dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: PG_URL, max: 2 }) }),
    log: (event) => {
      watched?.push(event.query.sql);
    },
  });
  const outbox = new KyselyOutboxStore({ db: logged, tablePrefix: base.tablePrefix });
  return {
    ...base,
    outbox,
    transaction: (work) => logged.transaction().execute(work),
    statementLog: {
      async watch(work) {
        const seen: string[] = [];
        watched = seen;
        try {
          await work();
        } finally {
          watched = undefined;
        }
        return seen;
      },
      // PostgreSQL: the INSERT takes the advisory locks.
      keyedAppendStatements: 1,
    },
    async close() {
      try {
        await outbox.close();
        await logged.destroy();
      } finally {
        await base.close();
      }
    },
  };
}, [outboxRoundTripCaseName]);
