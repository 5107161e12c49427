// Producer commits on Prisma 7 (@prisma/adapter-pg): Courier's `bus.outbox(tx).publish()` vs
// Prisma's own hand-written outbox insert in the same interactive transaction, so a Prisma
// user sees what Courier costs on their data layer. Standalone (not a scenario of main.ts: it
// needs a Prisma Client generated first, which this script does, offline, in ~1 s, through
// @courier/prisma/testing).
//
//   node --conditions=@courier/source --import tsx src/prisma-producer.ts [seconds] [rounds] [writers]
//
// Each mode is a closed loop of `writers` concurrent transactions, each the business row
// (`tx.order.create`, a Prisma model) plus, per mode: nothing; the hand-written outbox row
// (`tx.$executeRawUnsafe` INSERT into Courier's own outbox table, the same columns and values as
// Courier writes, as scenario 1's MikroORM baseline); Courier's publish, keyed by order id
// (its per-key advisory lock taken inside the INSERT); the same publish without a key (no lock,
// what the hand-written line does not take either). Modes interleave per round (A, B, C, A,
// B, C…) so load changes hit them alike; medians of the rounds are printed with the ratio.
import { fileURLToPath } from 'node:url';
import { createBus, InMemoryBroker } from '@courier/core';
import { PrismaOutboxStore, type PrismaRawClient } from '@courier/prisma';
import { loadPrismaClient } from '@courier/prisma/testing';
import { PrismaPg } from '@prisma/adapter-pg';
import { closedLoop } from './ceilings.js';
import { interleaved, median } from './scenarios/context.js';
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

// Generated offline into bench/.prisma-client/ (gitignored) by @courier/prisma/testing, once per Prisma version and schema.
const PrismaClient = await loadPrismaClient<new (options: { adapter: unknown }) => BenchPrisma>({ schema: SCHEMA, projectDir: fileURLToPath(new URL('..', import.meta.url)), name: 'producer' });
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
  const modes = ['business write only', 'hand-written outbox (Prisma $executeRaw)', 'Courier outbox publish (Prisma)', 'Courier publish, keyless (Prisma)'] as const;
  // This process's CPU per commit of each mode (medians of the rounds): with 8 writers on a
  // shared 2-core machine the client is what saturates first.
  const cpuPerCommit = new Map<string, number[]>(modes.map((mode) => [mode, []]));
  const rates = await interleaved(modes, rounds, async (mode) => {
    const before = process.cpuUsage();
    const rate = await closedLoop(writers, seconds, async () => {
      const id = `o-${(serial += 1)}`;
      await prisma.$transaction(async (tx) => {
        await order(tx, id);
        if (mode === 'hand-written outbox (Prisma $executeRaw)') await tx.$executeRawUnsafe(handInsert, ...outboxValues(id));
        else if (mode === 'Courier outbox publish (Prisma)') await bus.outbox(tx).publish(OrderPlaced, orderPayload(id), { key: id });
        else if (mode === 'Courier publish, keyless (Prisma)') await bus.outbox(tx).publish(OrderPlaced, orderPayload(id));
      }, TX);
    });
    const used = process.cpuUsage(before);
    cpuPerCommit.get(mode)!.push((used.user + used.system) / (rate * seconds));
    return rate;
  });
  const unit = `commits/s (${writers} writers)`;
  for (const mode of modes) console.log(`${mode.padEnd(42)} ${rates[mode].toFixed(0).padStart(7)} ${unit}, client CPU ${median(cpuPerCommit.get(mode)!).toFixed(0)} µs per commit`);
  const ratio = rates['Courier outbox publish (Prisma)'] / rates['hand-written outbox (Prisma $executeRaw)'];
  console.log(`Courier / hand-written on Prisma: ${ratio.toFixed(3)} (target ≥ 0.95: ${ratio >= 0.95 ? 'met' : 'NOT met'}); ${rounds} interleaved rounds of ${seconds} s, medians`);
  // The hand-written insert takes no per-key lock; the keyless line is Courier without it.
  const keyless = rates['Courier publish, keyless (Prisma)'] / rates['hand-written outbox (Prisma $executeRaw)'];
  console.log(`Courier keyless / hand-written on Prisma: ${keyless.toFixed(3)}`);
} finally {
  await outbox.close();
  await transport.close();
  await prisma.$disconnect();
}
