import { ConfigError } from '@courier/core';
import { createDialect, resolveTableNames, SqlStoreCore, type CourierTablesConfig, type DialectName } from '@courier/sql-engine';
import type { PrismaClientLike, PrismaRawClient, PrismaTransactionOptions } from './prisma-client.js';
import { PrismaExecutor } from './prisma-executor.js';

/** Arguments shared by {@link PrismaOutboxStore} and {@link PrismaInboxStore}. */
export interface PrismaStoreConfig<Tx extends PrismaRawClient> extends CourierTablesConfig {
  /** The application's Prisma Client, with a driver adapter (not a transaction client; not disconnected by the store). Relays and consumers open their transactions on it. */
  readonly prisma: PrismaClientLike<Tx>;
  /**
   * The SQL family of the database. Default: the client's provider (`postgresql`, `mysql`,
   * `sqlite`); set it where the client does not say (a wrapped client).
   */
  readonly dialect?: DialectName;
  /**
   * Options of the interactive transactions the stores open (claims, completions, inbox
   * handlers). Default `{ maxWait: 10_000, timeout: 60_000 }`: Prisma's own defaults (2 s to
   * get a connection, 5 s for the whole transaction) roll back a handler that runs longer
   * than 5 s and fail claims on a busy pool. `timeout` bounds your inbox handlers too.
   */
  readonly transactionOptions?: PrismaTransactionOptions;
}

const DEFAULT_TRANSACTION_OPTIONS: PrismaTransactionOptions = Object.freeze({ maxWait: 10_000, timeout: 60_000 });

/**
 * Names the SQL family of a Prisma Client from the provider it was generated for (or its
 * driver adapter's); `undefined` for one Courier does not support (SQL Server, MongoDB,
 * CockroachDB) or a client that does not say.
 */
export function detectPrismaDialect(prisma: object): DialectName | undefined {
  const config = (prisma as { _engineConfig?: { activeProvider?: unknown; adapter?: { provider?: unknown } } })._engineConfig;
  const provider = String(config?.activeProvider ?? config?.adapter?.provider ?? '');
  if (provider === 'postgresql' || provider === 'postgres') return 'postgresql';
  if (provider === 'mysql') return 'mysql';
  if (provider === 'sqlite') return 'sqlite';
  return undefined;
}

/** The key of Prisma 7's scope context, present on the client of an interactive transaction only. */
const TRANSACTION_SCOPE = Symbol.for('prisma.client.transaction.scope_context');

/**
 * True for the client of a Prisma interactive transaction (the `tx` of `prisma.$transaction(async (tx) => …)`),
 * false for a Prisma Client itself. Prisma 7 marks transaction clients with a scope context;
 * where it does not, a transaction client is one without `$transaction`.
 */
export function isPrismaTransactionClient(value: unknown): boolean {
  if (value === null || (typeof value !== 'object' && typeof value !== 'function')) return false;
  const candidate = value as { $executeRawUnsafe?: unknown; $queryRawUnsafe?: unknown; $transaction?: unknown; [TRANSACTION_SCOPE]?: unknown };
  if (typeof candidate.$executeRawUnsafe !== 'function' || typeof candidate.$queryRawUnsafe !== 'function') return false;
  if (candidate[TRANSACTION_SCOPE] !== undefined) return true;
  return typeof candidate.$transaction !== 'function';
}

/**
 * The engine's store core on Prisma: names and dialect from the config (the dialect read from
 * the client unless set), a {@link PrismaExecutor} on the client, and this package's remedies
 * in its errors.
 */
export class PrismaStoreCore<Tx extends PrismaRawClient> extends SqlStoreCore<Tx, PrismaExecutor<Tx>> {
  readonly prisma: PrismaClientLike<Tx>;
  readonly transactionOptions: PrismaTransactionOptions;

  constructor(config: PrismaStoreConfig<Tx>, what: string) {
    if (config === null || typeof config !== 'object' || config.prisma === null || typeof config.prisma !== 'object' || typeof config.prisma.$queryRawUnsafe !== 'function') {
      throw new ConfigError(`'prisma' is required: pass the application's Prisma Client (new PrismaClient({ adapter }))`);
    }
    if (isPrismaTransactionClient(config.prisma)) {
      throw new ConfigError(`'prisma' is the client of an interactive transaction: pass the Prisma Client itself (the store opens its own transactions on it; give the transaction client to bus.outbox(tx) instead)`);
    }
    const dialectName = config.dialect ?? detectPrismaDialect(config.prisma);
    if (dialectName === undefined) {
      throw new ConfigError(`the Prisma Client's provider is not one Courier knows: generate it for 'postgresql', 'mysql' or 'sqlite', or set 'dialect' to 'postgresql', 'mysql' or 'sqlite'`);
    }
    const names = resolveTableNames(config);
    const dialect = createDialect(dialectName, names);
    const options: string[] = [];
    if (config.tablePrefix !== undefined) options.push(`tablePrefix: ${JSON.stringify(config.tablePrefix)}`);
    if (config.schema !== undefined) options.push(`schema: ${JSON.stringify(config.schema)}`);
    const transactionOptions = { ...DEFAULT_TRANSACTION_OPTIONS, ...config.transactionOptions };
    super({
      executor: new PrismaExecutor(config.prisma, dialect.name, dialect.transactionPrologue, transactionOptions),
      dialect,
      names,
      what,
      packageName: '@courier/prisma',
      schemaHint: `create it with \`await store.ensureSchema()\` (on a store built with { ${['prisma', ...options].join(', ')} }), or add courierMigrationSql(…) to a Prisma migration`,
    });
    this.prisma = config.prisma;
    this.transactionOptions = transactionOptions;
  }
}
