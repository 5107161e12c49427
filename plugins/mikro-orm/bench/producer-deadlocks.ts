// Producer deadlocks per BENCH_SECONDS with producers that flush twice per transaction,
// appending their two keys in opposite orders. Run from plugins/mikro-orm:
//
//   node --conditions=@courier/source --import tsx bench/producer-deadlocks.ts
//
// Settings (environment): BENCH_DIALECTS (comma list of fixture dialects, default
// "mariadb,postgresql"), BENCH_SECONDS (default 10), BENCH_PRODUCERS (default 4), plus the
// fixtures' COURIER_PG_URL / COURIER_MARIADB_URL. Each transaction persists an entity,
// appends key A, flushes, appends key B and commits; half the producers use (A, B) =
// (alpha, beta), the other half (beta, alpha), and every producer also draws one pair from
// 64 other keys (so keys that merely share a MariaDB lock bucket meet too).
// Prints deadlocks (retriable StorageErrors caused by 1213 / 40P01) and commits.
import { uniqueId } from '@courier/conformance';
import { StorageError } from '@courier/core';
import { createMikroOrmFixture, FIXTURE_DIALECTS, type FixtureDialect } from '../test/support/fixture.js';
import { envelope } from '../test/support/helpers.js';

const SECONDS = Number(process.env['BENCH_SECONDS'] ?? 10);
const PRODUCERS = Number(process.env['BENCH_PRODUCERS'] ?? 4);
const DIALECTS = (process.env['BENCH_DIALECTS'] ?? 'mariadb,postgresql').split(',') as FixtureDialect[];

function isDeadlock(error: unknown): boolean {
  let current: unknown = error;
  while (current !== null && typeof current === 'object') {
    const candidate = current as { errno?: unknown; code?: unknown; cause?: unknown };
    if (candidate.errno === 1213 || candidate.code === '40P01') return true;
    current = candidate.cause;
  }
  return false;
}

async function measure(dialect: FixtureDialect): Promise<{ deadlocks: number; commits: number; otherErrors: number }> {
  const fixture = await createMikroOrmFixture(dialect, { testId: uniqueId() }, { orm: { pool: { min: PRODUCERS, max: PRODUCERS + 2 } } });
  let deadlocks = 0;
  let commits = 0;
  let otherErrors = 0;
  const deadline = Date.now() + SECONDS * 1_000;
  const producer = async (index: number): Promise<void> => {
    let round = 0;
    while (Date.now() < deadline) {
      round += 1;
      const random = [`key-${Math.floor(Math.random() * 64)}`, `key-${Math.floor(Math.random() * 64)}`];
      const keys = round % 2 === 0 ? (index % 2 === 0 ? ['alpha', 'beta'] : ['beta', 'alpha']) : random;
      try {
        await fixture.orm.em.fork().transactional(async (tx) => {
          tx.persist(tx.create(fixture.Effect, { effectId: `p${index}-${round}` }));
          fixture.outbox.append(tx, [{ envelope: envelope(fixture.tablePrefix, keys[0]!) }]);
          await tx.flush();
          fixture.outbox.append(tx, [{ envelope: envelope(fixture.tablePrefix, keys[1]!) }]);
        });
        commits += 1;
      } catch (error) {
        if (error instanceof StorageError && isDeadlock(error)) deadlocks += 1;
        else if (isDeadlock(error)) deadlocks += 1;
        else {
          otherErrors += 1;
          if (otherErrors <= 3) console.error(error);
        }
      }
    }
  };
  try {
    await Promise.all(Array.from({ length: PRODUCERS }, (_, index) => producer(index)));
  } finally {
    await fixture.close();
  }
  return { deadlocks, commits, otherErrors };
}

for (const dialect of DIALECTS) {
  if (!FIXTURE_DIALECTS.includes(dialect)) throw new Error(`unknown dialect ${dialect}`);
  const result = await measure(dialect);
  console.log(`${dialect}: ${PRODUCERS} producers, ${SECONDS} s: ${result.deadlocks} deadlocks, ${result.commits} commits, ${result.otherErrors} other errors`);
}
