import { ConfigError } from '@courier/core';
import type { EntityManager, EventManager, EventSubscriber, FlushEventArgs, Transaction, TransactionEventArgs } from '@mikro-orm/core';

/**
 * Binds appended outbox rows to MikroORM units of work.
 *
 * `append` is synchronous and only remembers the rows against the EntityManager that
 * will flush them. A flush-event subscriber then writes them:
 *
 * - flush inside a transaction (`em.transactional`, `em.begin()`, a nested transactional
 *   fork): at `afterFlush`, still inside that transaction, on its connection;
 * - flush that opens its own implicit transaction: at `beforeTransactionCommit`, after
 *   the entity changes and before COMMIT, so the per-key lock is held only for the commit;
 * - flush with nothing else to write (MikroORM opens no transaction then): at
 *   `afterFlush`, in a transaction of the store's own, before `flush()` resolves.
 *
 * Either way the rows commit with the flush or not at all, and `flush()` rejects if they
 * cannot be written. Rows are handed to exactly one write: if that transaction rolls
 * back, they are gone with it, as MikroORM forgets the entity changes of a failed flush.
 */
export class OutboxUnitOfWork<Row> {
  readonly #orm: { readonly em: EntityManager };
  readonly #pending = new WeakMap<EntityManager, Row[]>();
  readonly #registered = new WeakSet<EventManager>();
  /** Root transactions that carry rows, for the after-commit wake-up. */
  readonly #written = new WeakSet<object>();
  readonly #subscriber: EventSubscriber;
  readonly #write: (rows: readonly Row[], trx: Transaction) => Promise<void>;
  readonly #writeAlone: (rows: readonly Row[]) => Promise<void>;
  readonly #committed: () => void;

  constructor(options: {
    orm: { readonly em: EntityManager };
    /** Writes rows inside `trx` (lock, then insert). */
    write: (rows: readonly Row[], trx: Transaction) => Promise<void>;
    /** Writes rows in a transaction of the store's own. */
    writeAlone: (rows: readonly Row[]) => Promise<void>;
    /** Called after a transaction that carried rows committed. */
    committed: () => void;
  }) {
    this.#orm = options.orm;
    this.#write = options.write;
    this.#writeAlone = options.writeAlone;
    this.#committed = options.committed;
    this.#subscriber = {
      afterFlush: (args: FlushEventArgs) => this.#afterFlush(args.em),
      beforeTransactionCommit: (args: TransactionEventArgs) => this.#beforeCommit(args.em, args.transaction),
      afterTransactionCommit: (args: TransactionEventArgs) => this.#afterCommit(args.transaction),
    };
    this.#register(options.orm.em.getEventManager());
  }

  /**
   * Remembers `rows` against the unit of work of `em`. Throws a `ConfigError` (code
   * `UNIT_OF_WORK_REQUIRED` or `UNIT_OF_WORK_ENDED`), remembering nothing, when `em`
   * cannot carry them.
   */
  add(em: EntityManager, rows: readonly Row[]): void {
    const target = this.resolve(em);
    if (rows.length === 0) return;
    this.#register(target.getEventManager());
    const list = this.#pending.get(target);
    if (list) list.push(...rows);
    else this.#pending.set(target, [...rows]);
  }

  /** The EntityManager whose flush will carry appends made through `em`, after every misuse check. */
  resolve(em: EntityManager): EntityManager {
    if (!isEntityManager(em)) {
      throw new ConfigError(`'append' needs a MikroORM EntityManager (a fork, or the 'em' of em.transactional()), got ${describe(em)}`, {
        code: 'UNIT_OF_WORK_REQUIRED',
      });
    }
    if (em.getDriver() !== this.#orm.em.getDriver()) {
      throw new ConfigError(
        `'append' got an EntityManager of another MikroORM instance: pass an EntityManager forked from the ORM the outbox store was created with`,
        { code: 'UNIT_OF_WORK_REQUIRED' },
      );
    }
    // A global EntityManager used inside RequestContext or em.transactional() stands for
    // the context's fork, which is what its flush will flush.
    const target = em.getContext(false);
    if (target.global) {
      throw new ConfigError(
        `'append' got the global EntityManager, which has no unit of work of its own: use em.fork(), RequestContext.create(), or the 'em' that em.transactional() passes to its callback`,
        { code: 'UNIT_OF_WORK_REQUIRED' },
      );
    }
    const trx = target.getTransactionContext();
    if (trx !== undefined && isCompleted(trx)) {
      throw new ConfigError(
        `'append' got an EntityManager whose transaction has already ended (committed or rolled back): publish inside the transactional callback before it returns, or on a fresh fork`,
        { code: 'UNIT_OF_WORK_ENDED' },
      );
    }
    if (trx === undefined && (disablesTransactions(target) || !target.config.get('implicitTransactions'))) {
      throw new ConfigError(
        `'append' needs a transaction: this EntityManager flushes without one (implicitTransactions or disableTransactions); publish inside em.transactional()`,
        { code: 'UNIT_OF_WORK_REQUIRED' },
      );
    }
    return target;
  }

  #register(events: EventManager): void {
    if (this.#registered.has(events)) return;
    this.#registered.add(events);
    events.registerSubscriber(this.#subscriber);
  }

  #take(em: EntityManager): Row[] | undefined {
    const rows = this.#pending.get(em);
    if (!rows || rows.length === 0) return undefined;
    this.#pending.delete(em);
    return rows;
  }

  async #afterFlush(em: EntityManager): Promise<void> {
    const rows = this.#take(em);
    if (!rows) return;
    const trx = em.getTransactionContext();
    if (trx !== undefined) {
      if (isCompleted(trx)) {
        throw new ConfigError(`the EntityManager's transaction ended before its outbox rows were written: flush inside the transaction`, {
          code: 'UNIT_OF_WORK_ENDED',
        });
      }
      await this.#write(rows, trx);
      this.#written.add(rootOf(trx));
      return;
    }
    await this.#writeAlone(rows);
    this.#committed();
  }

  async #beforeCommit(em: EntityManager, trx: Transaction | undefined): Promise<void> {
    const rows = this.#take(em);
    if (!rows) return;
    if (trx === undefined) throw new Error('beforeTransactionCommit without a transaction');
    await this.#write(rows, trx);
    this.#written.add(rootOf(trx));
  }

  #afterCommit(trx: Transaction | undefined): void {
    if (trx === undefined || !this.#written.has(rootOf(trx))) return;
    this.#written.delete(rootOf(trx));
    this.#committed();
  }
}

function isEntityManager(value: unknown): value is EntityManager {
  if (value === null || typeof value !== 'object') return false;
  const candidate = value as Partial<Record<'getContext' | 'getDriver' | 'getEventManager' | 'getTransactionContext', unknown>>;
  return (
    typeof candidate.getContext === 'function' &&
    typeof candidate.getDriver === 'function' &&
    typeof candidate.getEventManager === 'function' &&
    typeof candidate.getTransactionContext === 'function'
  );
}

function isCompleted(trx: Transaction): boolean {
  const knexTrx = trx as { isCompleted?: () => boolean };
  return typeof knexTrx.isCompleted === 'function' && knexTrx.isCompleted();
}

function disablesTransactions(em: EntityManager): boolean {
  return (em as unknown as { disableTransactions?: boolean }).disableTransactions === true;
}

/** The top-level transaction of a (possibly nested, savepoint) knex transaction. */
function rootOf(trx: Transaction): object {
  let current = trx as { parentTransaction?: unknown };
  while (current.parentTransaction !== undefined && current.parentTransaction !== null) {
    current = current.parentTransaction as { parentTransaction?: unknown };
  }
  return current;
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value !== 'object') return typeof value;
  return value.constructor?.name ?? 'an object';
}
