// @courier/prisma: Courier's outbox and inbox on Prisma 7 with a driver adapter (PostgreSQL,
// MySQL/MariaDB, SQLite), an adapter of @courier/sql-engine: the engine holds the SQL, this
// package says how to run it through a Prisma Client and how to join the application's
// interactive transaction.
export type { CourierTableNames, CourierTablesConfig, DialectName, DriverErrorKind } from '@courier/sql-engine';
export { classifyDriverError, resolveTableNames, SCHEMA_VERSION } from '@courier/sql-engine';
export type { CourierMigrationSqlOptions } from './courier-migration-sql.js';
export { courierMigrationSql } from './courier-migration-sql.js';
export type { PrismaClientLike, PrismaRawClient, PrismaTransactionOptions } from './prisma-client.js';
export { PrismaDriverError } from './prisma-errors.js';
export { PrismaExecutor } from './prisma-executor.js';
export type { PrismaStoreConfig } from './prisma-store-core.js';
export { detectPrismaDialect, isPrismaTransactionClient, PrismaStoreCore } from './prisma-store-core.js';
export { prismaSchemaAdmin } from './prisma-schema-admin.js';
export type { PrismaInboxStoreConfig } from './prisma-inbox-store.js';
export { PrismaInboxStore } from './prisma-inbox-store.js';
export type { PrismaOutboxStoreConfig } from './prisma-outbox-store.js';
export { PrismaOutboxStore } from './prisma-outbox-store.js';
