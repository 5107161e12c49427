// Producer commits on Prisma 7 (@prisma/adapter-pg): Courier's `bus.outbox(tx).publish()` vs
// Prisma's own hand-written outbox insert in the same interactive transaction, so a Prisma
// user sees what Courier costs on their data layer. Standalone (not a scenario of main.ts: it
// needs a Prisma Client generated first, which this script does, offline, in ~1 s).
//
//   node --conditions=@courier/source --import tsx src/prisma-producer.ts [seconds] [rounds] [writers]
//
// Each mode is a closed loop of `writers` concurrent transactions, each the business row
// (`tx.order.create`, a Prisma model) plus, per mode: nothing; the hand-written outbox row
// (`tx.$executeRawUnsafe` INSERT into Courier's own outbox table, the same columns and values as
// Courier writes, as scenario 1's MikroORM baseline); Courier's publish, keyed by order id
// (its per-key advisory lock taken inside the INSERT). Modes interleave per round (A, B, C, A,
// B, C…) so load changes hit them alike; medians of the rounds are printed with the ratio.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { createBus, InMemoryBroker } from '@courier/core';
import { PrismaOutboxStore, type PrismaRawClient } from '@courier/prisma';
import { PrismaPg } from '@prisma/adapter-pg';
import { closedLoop } from './ceilings.js';
import { interleaved } from './scenarios/context.js';
import { URLS } from './services.js';
import { OrderPlaced, orderPayload, OUTBOX_COLUMNS, outboxValues, runId } from './setup.js';

const seconds = Number(process.argv[2] ?? 4);
const rounds = Number(process.argv[3] ?? 3);
const writers = Number(process.argv[4] ?? 8);
const ORDERS = 'bench_prisma_orders';

// The schema: one business model; Courier's tables are not modelled (it writes them with raw SQL).
const SCHEMA = `generator client {
  provider            = "prisma-client"
  output              = "./client"
  moduleFormat        = "esm"
  importFileExtension = "ts"
}

datasource db {
  provider = "postgresql"
}

model Order {
  id         String   @id
  customerId String   @map("customer_id")
  totalCents Int      @map("total_cents")
  createdAt  DateTime @map("created_at") @db.Timestamptz(3)

  @@map("${ORDERS}")
}
`;

interface Tx extends PrismaRawClient {
  order: { create(args: { data: { id: string; customerId: string; totalCents: number; createdAt: Date } }): Promise<unknown> };
}
interface BenchPrisma {
  $transaction<R>(fn: (tx: Tx) => Promise<R>, options?: { maxWait?: number; timeout?: number }): Promise<R>;
  $executeRawUnsafe(query: string, ...values: unknown[]): Promise<number>;
  $queryRawUnsafe<T = unknown>(query: string, ...values: unknown[]): Promise<T>;
  $disconnect(): Promise<void>;
}

/** Generates the client into bench/.prisma-client (gitignored) once; `prisma generate` asks for a schema engine it does not use here. */
async function loadClient(): Promise<new (options: { adapter: unknown }) => BenchPrisma> {
  const require = createRequire(import.meta.url);
  const dir = fileURLToPath(new URL('../.prisma-client/producer', import.meta.url));
  if (!existsSync(join(dir, 'client.ts'))) {
    const work = `${dir}.tmp-${process.pid}`;
    mkdirSync(work, { recursive: true });
    writeFileSync(join(work, 'schema.prisma'), SCHEMA);
    const cli = join(dirname(require.resolve('prisma/package.json')), 'build', 'index.js');
    execFileSync(process.execPath, [cli, 'generate', '--schema', join(work, 'schema.prisma')], {
      cwd: work,
      env: { ...process.env, PRISMA_SCHEMA_ENGINE_BINARY: process.env['PRISMA_SCHEMA_ENGINE_BINARY'] ?? '/bin/true', PRISMA_HIDE_UPDATE_MESSAGE: '1', CHECKPOINT_DISABLE: '1' },
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    rmSync(dir, { recursive: true, force: true });
    renameSync(join(work, 'client'), dir);
    rmSync(work, { recursive: true, force: true });
  }
  return ((await import(pathToFileURL(join(dir, 'client.ts')).href)) as { PrismaClient: new (options: { adapter: unknown }) => BenchPrisma }).PrismaClient;
}

const PrismaClient = await loadClient();
const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: URLS.postgresql, max: writers + 2 }) });
const prefix = `${runId()}_`;
const outbox = new PrismaOutboxStore<Tx>({ prisma, tablePrefix: prefix });
const transport = new InMemoryBroker().connect();
const bus = createBus({ outbox, transport });
const TX = { maxWait: 30_000, timeout: 60_000 };
try {
  await outbox.ensureSchema();
  await prisma.$executeRawUnsafe(`CREATE TABLE IF NOT EXISTS ${ORDERS} (id text PRIMARY KEY, customer_id text NOT NULL, total_cents integer NOT NULL, created_at timestamptz(3) NOT NULL)`);
  await prisma.$executeRawUnsafe(`TRUNCATE ${ORDERS}`);
  const handInsert = `INSERT INTO "${prefix}outbox" (${OUTBOX_COLUMNS}) VALUES (${Array.from({ length: 13 }, (_, i) => `$${i + 1}`).join(', ')}, 'pending', 0, now(), now())`;
  let serial = 0;
  const order = (tx: Tx, id: string) => tx.order.create({ data: { id, customerId: `c-${id.slice(-6)}`, totalCents: 12_345, createdAt: new Date() } });
  const modes = ['business write only', 'hand-written outbox (Prisma $executeRaw)', 'Courier outbox publish (Prisma)'] as const;
  const rates = await interleaved(modes, rounds, (mode) =>
    closedLoop(writers, seconds, async () => {
      const id = `o-${(serial += 1)}`;
      await prisma.$transaction(async (tx) => {
        await order(tx, id);
        if (mode === 'hand-written outbox (Prisma $executeRaw)') await tx.$executeRawUnsafe(handInsert, ...outboxValues(id));
        else if (mode === 'Courier outbox publish (Prisma)') await bus.outbox(tx).publish(OrderPlaced, orderPayload(id), { key: id });
      }, TX);
    }),
  );
  const unit = `commits/s (${writers} writers)`;
  for (const mode of modes) console.log(`${mode.padEnd(42)} ${rates[mode].toFixed(0).padStart(7)} ${unit}`);
  const ratio = rates['Courier outbox publish (Prisma)'] / rates['hand-written outbox (Prisma $executeRaw)'];
  console.log(`Courier / hand-written on Prisma: ${ratio.toFixed(3)} (target ≥ 0.95: ${ratio >= 0.95 ? 'met' : 'NOT met'}); ${rounds} interleaved rounds of ${seconds} s, medians`);
} finally {
  await outbox.close();
  await transport.close();
  await prisma.$disconnect();
}
