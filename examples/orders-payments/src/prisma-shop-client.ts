// The example's Prisma Client: generated from prisma/schema.prisma at run time, offline, by
// @courier/prisma/testing (as @courier/prisma's own tests generate theirs): `prisma generate`
// asks for a schema engine it does not use for a client and, without
// PRISMA_SCHEMA_ENGINE_BINARY, tries to download one (binaries.prisma.sh is unreachable on
// these machines); the client itself needs no engine. The output goes to .prisma-client/
// (git-ignored), named by Prisma version and schema hash, so an edited schema is regenerated.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { PrismaTransactionOptions } from '@courier/prisma';
import { generatePrismaClient } from '@courier/prisma/testing';

const EXAMPLE_DIR = fileURLToPath(new URL('..', import.meta.url));
const SCHEMA_FILE = join(EXAMPLE_DIR, 'prisma', 'schema.prisma');

/** An order row as Prisma returns it (model `Order`, table `orders`). */
export interface PrismaOrder {
  readonly id: string;
  readonly customerId: string;
  readonly totalCents: number;
  readonly currency: string;
  readonly status: string;
  readonly placedMessageId: string;
  readonly paidCount: number;
  readonly paymentId: string | null;
  readonly paidCausationId: string | null;
  readonly paidCorrelationId: string | null;
}

/**
 * What the example uses of the generated client inside a transaction (`tx`) and outside it.
 * In a project of your own this is simply the generated `PrismaClient` (and `ctx.tx` is
 * inferred from it); here the client is generated at run time, after type-checking, so the
 * example names the part it calls.
 */
export interface ShopPrismaTx {
  readonly order: {
    create(args: { data: Omit<PrismaOrder, 'paidCount' | 'paymentId' | 'paidCausationId' | 'paidCorrelationId'> }): PromiseLike<unknown>;
    findMany(args: { select: { id: true } }): PromiseLike<{ id: string }[]>;
    updateMany(args: {
      where: { id: string };
      data: { status: string; paidCount: { increment: number }; paymentId: string; paidCausationId: string | null; paidCorrelationId: string; paidAt: Date };
    }): PromiseLike<{ count: number }>;
  };
  readonly payment: {
    create(args: { data: { id: string; orderId: string; amountCents: number; currency: string; orderMessageId: string; capturedMessageId: string } }): PromiseLike<unknown>;
  };
  readonly inboxDuplicate: {
    create(args: { data: { messageId: string; consumer: string } }): PromiseLike<unknown>;
  };
  $executeRawUnsafe(query: string, ...values: unknown[]): PromiseLike<number>;
  $queryRawUnsafe<T = unknown>(query: string, ...values: unknown[]): PromiseLike<T>;
}

/** The generated `PrismaClient`, by the part the example uses. */
export interface ShopPrismaClient extends ShopPrismaTx {
  $transaction<R>(fn: (tx: ShopPrismaTx) => Promise<R>, options?: PrismaTransactionOptions): Promise<R>;
  $disconnect(): Promise<void>;
}

type ShopPrismaClientClass = new (options: { adapter: unknown }) => ShopPrismaClient;

/**
 * Generates the client from prisma/schema.prisma unless this Prisma version already generated
 * it for this schema, and returns the directory holding it (`client.ts`). Several processes
 * may call it at once (see generatePrismaClient). Fails with Prisma's own output when
 * generation fails.
 */
export function generateShopPrismaClient(): string {
  return generatePrismaClient({ schema: readFileSync(SCHEMA_FILE, 'utf8'), projectDir: EXAMPLE_DIR, name: 'shop' });
}

/**
 * Opens the generated client on PostgreSQL through `@prisma/adapter-pg`: the models' tables
 * in `schema` (the run's), a pool of at most `poolMax` connections. It connects on first use,
 * so a worker started while PostgreSQL is down comes up and its bus waits for the server.
 */
export async function openShopPrisma(url: string, schema: string, poolMax: number): Promise<ShopPrismaClient> {
  const dir = generateShopPrismaClient();
  const { PrismaClient } = (await import(pathToFileURL(join(dir, 'client.ts')).href)) as { PrismaClient: ShopPrismaClientClass };
  const { PrismaPg } = await import('@prisma/adapter-pg');
  return new PrismaClient({ adapter: new PrismaPg({ connectionString: url, max: poolMax }, { schema }) });
}
