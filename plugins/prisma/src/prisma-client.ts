/**
 * What Courier uses of a Prisma Client or of the transaction client of an interactive
 * transaction: raw statements with positional parameters. Generated clients (`prisma-client`
 * and `prisma-client-js` generators) and clients with `$extends` have both.
 */
export interface PrismaRawClient {
  $executeRawUnsafe(query: string, ...values: unknown[]): PromiseLike<number>;
  $queryRawUnsafe<T = unknown>(query: string, ...values: unknown[]): PromiseLike<T>;
}

/** Options of an interactive transaction, as Prisma's `$transaction(fn, options)` takes them. */
export interface PrismaTransactionOptions {
  /** Longest wait for a connection from the adapter's pool, ms (Prisma's default: 2,000). */
  readonly maxWait?: number;
  /** Longest time the transaction may stay open before Prisma rolls it back, ms (Prisma's default: 5,000). */
  readonly timeout?: number;
  /** The isolation level; default: the database's own. */
  readonly isolationLevel?: 'ReadUncommitted' | 'ReadCommitted' | 'RepeatableRead' | 'Serializable' | 'Snapshot';
}

/**
 * A Prisma Client (not a transaction client): raw statements, and interactive transactions
 * whose callback receives `Tx` — `Omit<PrismaClient, ITXClientDenyList>` for a generated
 * client, inferred by the stores, so `ctx.tx` is typed as in your own `$transaction` callbacks.
 */
export interface PrismaClientLike<Tx extends PrismaRawClient = PrismaRawClient> extends PrismaRawClient {
  $transaction<R>(fn: (tx: Tx) => Promise<R>, options?: PrismaTransactionOptions): Promise<R>;
}
