// One process of the SQLite multi-process test: opens the shared file through its own
// MikroORM, then appends, claims and consumes (inbox run + complete) until its deadline,
// drains what is left, and prints one JSON line of counts. Errors are counted, not thrown:
// the parent asserts there were none.
import { classifyDriverError } from '@courier/sql-engine';
import { createMikroOrmFixture } from './fixture.js';
import { envelope } from './helpers.js';

interface WorkerConfig {
  readonly testId: string;
  readonly index: number;
  readonly durationMs: number;
}

const config = JSON.parse(process.env['COURIER_SQLITE_WORKER'] ?? '{}') as WorkerConfig;
// `duplicates`: messages the inbox had already seen (handed to two workers); `lostLeases`:
// completions fenced out because another worker had claimed the rows meanwhile. With leases
// far longer than a round, both mean two claims took the same row.
const counts = { appended: 0, claims: 0, ran: 0, duplicates: 0, lostLeases: 0, inboxInserts: 0, errors: 0, busyErrors: 0, firstErrors: [] as string[] };
const inboxInsert = new RegExp(`^INSERT INTO "${config.testId}_inbox" `);

function failed(error: unknown): void {
  counts.errors += 1;
  if (/SQLITE_BUSY|database is locked/i.test(String(error)) || /SQLITE_BUSY/.test(String((error as { cause?: { code?: unknown } }).cause?.code))) counts.busyErrors += 1;
  if (counts.firstErrors.length < 5) counts.firstErrors.push(`${String(error).slice(0, 300)} (${classifyDriverError((error as { cause?: unknown }).cause ?? error)})`);
}

const fixture = await createMikroOrmFixture(
  'sqlite',
  { testId: config.testId },
  {
    orm: {
      onQuery: (sql: string) => {
        if (inboxInsert.test(sql)) counts.inboxInserts += 1;
        return sql;
      },
    },
  },
).catch((error: unknown) => {
  failed(error);
  return undefined;
});
if (fixture) {
  const topic = `${config.testId}.mp`;
  const deadline = Date.now() + config.durationMs;
  // Drains for at most 10 s after producing; what is left the parent finishes.
  for (let round = 0, idle = 0; idle < 5 && Date.now() < deadline + 10_000; round += 1) {
    const producing = Date.now() < deadline;
    if (producing) {
      const batch = Array.from({ length: 5 }, (_, index) => envelope(topic, `k${(round + index + config.index) % 7}`));
      try {
        await fixture.transaction(async (tx) => fixture.outbox.append(tx, batch.map((item) => ({ envelope: item }))));
        counts.appended += batch.length;
      } catch (error) {
        failed(error);
      }
    }
    let claimed;
    try {
      claimed = await fixture.outbox.claim({ owner: `worker-${config.index}`, limit: 10, leaseMs: 20_000, perKey: config.index % 2 === 0 ? 1 : 3 });
      counts.claims += 1;
    } catch (error) {
      failed(error);
      if (!producing) idle += 1;
      continue;
    }
    idle = producing || claimed.records.length > 0 ? 0 : idle + 1;
    const done: bigint[] = [];
    for (const record of claimed.records) {
      try {
        const result = await fixture.inbox.run(record.envelope.messageId, 'consumer', (tx) => fixture.recordEffect(tx, record.envelope.messageId));
        if (result.duplicate) counts.duplicates += 1;
        else counts.ran += 1;
        done.push(record.sequence);
      } catch (error) {
        failed(error);
        break;
      }
    }
    try {
      if (done.length > 0) counts.lostLeases += done.length - (await fixture.outbox.complete(claimed.lease, done));
    } catch (error) {
      failed(error);
    }
  }
  await fixture.close();
}
process.stdout.write(`RESULT ${JSON.stringify(counts)}\n`, () => process.exit(0));
