import { sqlSchemaAdmin, type SqlSchemaAdmin } from '@courier/sql-engine';
import type { PrismaRawClient } from './prisma-client.js';
import { PrismaStoreCore, type PrismaStoreConfig } from './prisma-store-core.js';

/**
 * Schema status and migration on a Prisma Client, for `courier migrate` (the `schema` member
 * of a `courier.config.ts`): build it with the same `prisma`, `tablePrefix` and `schema` as the
 * stores.
 *
 * Guarantees (the engine's `sqlSchemaAdmin`): `status` and `pendingSql` change nothing (a
 * missing table reads as version 0, nothing is created by reading); `pendingSql` is empty
 * exactly when the schema is current; `apply` is `ensureSchema()`: idempotent, safe from
 * several processes at once.
 */
export function prismaSchemaAdmin<Tx extends PrismaRawClient>(config: PrismaStoreConfig<Tx>): SqlSchemaAdmin {
  return sqlSchemaAdmin(new PrismaStoreCore(config, 'prismaSchemaAdmin'));
}
