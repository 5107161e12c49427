import { createRequire } from 'node:module';
import { ConfigError } from '@courier/core';
import type { EntityManager, EventManager, EventSubscriber, FlushEventArgs, Transaction, TransactionContext as TransactionContextClass, TransactionEventArgs } from '@mikro-orm/core';
import { TransactionLinks } from './mikro-orm-compat.js';

/**
 * MikroORM's `TransactionContext`, loaded on first use with `require`: a value `import` would
 * make Node's ESM loader lex the whole CommonJS package at start-up (see
 * `test/module-loading.test.ts`). By the first append the application has loaded MikroORM,
 * so this is a cache hit on the same module instance (a peer dependency resolves to the
 * application's copy).
 */
let transactionContext: typeof TransactionContextClass | undefined;
function activeEntityManager(name: string): EntityManager | undefined {
  transactionContext ??= (createRequire(import.meta.url)('@mikro-orm/core') as { TransactionContext: typeof TransactionContextClass }).TransactionContext;
  return transactionContext.getEntityManager(name) as EntityManager | undefined;
}

/** Rows remembered against an EntityManager, with the transaction they were appended in. */
interface PendingBatch<Row> {
  /** The EntityManager's transaction at append time; `undefined` when it had none (the next flush's own). */
  readonly trx: Transaction | undefined;
  readonly rows: Row[];
}

/** Rows flushed inside a transaction, waiting for its root transaction's commit. */
interface DeferredBatch<Row> {
  /** The (possibly nested, savepoint) transaction the flush ran in. */
  readonly trx: Transaction;
  readonly rows: readonly Row[];
}

/**
 * Binds appended outbox rows to MikroORM units of work.
 *
 * `append` is synchronous and only remembers the rows against the EntityManager that
 * will flush them, with the transaction they were appended in. A flush-event subscriber
 * then writes them:
 *
 * - flush that opens its own implicit transaction: at `beforeTransactionCommit`, after
 *   the entity changes and before COMMIT;
 * - flush inside a transaction that MikroORM began (`em.transactional`, `em.begin()`, a
 *   nested transactional fork): the flush hands them to that transaction, and its root's
 *   `beforeTransactionCommit` writes every row the transaction collected, from all its
 *   flushes, taking all their key locks in one sorted pass right before COMMIT — so two
 *   producers never wait for each other's key locks in opposite orders (no deadlock), and
 *   the locks are held only for the commit;
 * - flush inside a transaction MikroORM did not begin (a knex transaction set with
 *   `setTransactionContext`), whose commit MikroORM does not announce: at `afterFlush`,
 *   inside it;
 * - flush with nothing else to write (MikroORM opens no transaction then): at
 *   `afterFlush`, in a transaction of the store's own, before `flush()` resolves.
 *
 * Rows belong to the transaction they were appended in: a root rollback (`em.rollback()`,
 * a throwing `transactional`, a failed implicit flush) discards every row the
 * EntityManager holds and every row the transaction collected; a savepoint rollback
 * discards what was flushed inside it; `em.clear()` discards rows not flushed yet; a row
 * appended in a transaction that has ended is never written by a later one. Appending to
 * an EntityManager while a transactional fork of it (or of its transaction) is active in
 * the same async context is refused: the rows would not be part of the fork's transaction.
 */
export class OutboxUnitOfWork<Row> {
  readonly #orm: { readonly em: EntityManager };
  readonly #pending = new WeakMap<EntityManager, PendingBatch<Row>[]>();
  /** Rows flushed inside a transaction MikroORM began, by root transaction. */
  readonly #deferred = new WeakMap<object, DeferredBatch<Row>[]>();
  /** Root transactions MikroORM announced (afterTransactionStart): their commit will be announced too. */
  readonly #announced = new WeakSet<object>();
  /** Savepoints rolled back, and those whose rollback is watched. */
  readonly #rolledBack = new WeakSet<object>();
  readonly #watchedSavepoints = new WeakSet<object>();
  /** Savepoint links and ended transactions, on MikroORM 6 and 7 alike (mikro-orm-compat.ts). */
  readonly #links = new TransactionLinks((savepoint) => this.#rolledBack.add(savepoint));
  /** Units of work whose clear() discards their EntityManager's rows. */
  readonly #watchedClears = new WeakSet<object>();
  readonly #registered = new WeakSet<EventManager>();
  /** Root transactions that carry rows, for the after-commit wake-up. */
  readonly #written = new WeakSet<object>();
  readonly #subscriber: EventSubscriber;
  readonly #write: (rows: readonly Row[], trx: Transaction) => Promise<void>;
  readonly #writeAlone: (rows: readonly Row[]) => Promise<void>;
  readonly #committed: () => void;

  constructor(options: {
    orm: { readonly em: EntityManager };
    /** Writes rows inside `trx` (lock every key in one sorted pass, then insert). */
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
      beforeTransactionStart: (args: TransactionEventArgs) => this.#links.beforeStart(args.em, args.transaction),
      afterTransactionStart: (args: TransactionEventArgs) => {
        this.#links.afterStart(args.em, args.transaction);
        if (args.transaction !== undefined) this.#announced.add(args.transaction);
      },
      beforeTransactionCommit: (args: TransactionEventArgs) => this.#beforeCommit(args.em, args.transaction),
      afterTransactionCommit: (args: TransactionEventArgs) => this.#afterCommit(args.transaction),
      afterTransactionRollback: (args: TransactionEventArgs) => this.#afterRollback(args.em, args.transaction),
    };
    this.#register(options.orm.em.getEventManager());
  }

  /**
   * Remembers `rows` against the unit of work of `target`, in its current transaction.
   * `target` is what {@link resolve} returned for the caller's EntityManager (so every
   * misuse check has run, once); the array is taken over, not copied.
   */
  add(target: EntityManager, rows: Row[]): void {
    if (rows.length === 0) return;
    this.#register(target.getEventManager());
    this.#watchClear(target);
    const trx = target.getTransactionContext();
    const batches = this.#pending.get(target);
    const last = batches?.at(-1);
    if (last !== undefined && last.trx === trx) last.rows.push(...rows);
    else if (batches) batches.push({ trx, rows });
    else this.#pending.set(target, [{ trx, rows }]);
  }

  /**
   * The EntityManager whose flush will carry appends made through `em`, after every misuse
   * check. Throws a `ConfigError` (code `UNIT_OF_WORK_REQUIRED` or `UNIT_OF_WORK_ENDED`)
   * when `em` cannot carry rows.
   */
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
    if (trx !== undefined && this.#links.isCompleted(trx)) {
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
    // Inside em.transactional(cb) the outer EntityManager is still usable, but its rows
    // would be flushed by it, outside the callback's transaction (lost if that commits
    // and it is never flushed, published if that rolls back and it is).
    const active = activeEntityManager(target.name);
    const activeTrx = active !== undefined && active !== target && active.getDriver() === target.getDriver() ? active.getTransactionContext() : undefined;
    if (activeTrx !== undefined && !this.#links.isCompleted(activeTrx) && (trx === undefined || this.#rootOf(trx) === this.#rootOf(activeTrx))) {
      throw new ConfigError(
        `'append' got an EntityManager whose em.transactional() fork is active here: publish on the 'em' the transactional callback received, so the message commits or rolls back with that transaction`,
        { code: 'UNIT_OF_WORK_REQUIRED' },
      );
    }
    return target;
  }

  // The chain helpers walk savepoint links without building an array: every producing
  // transaction passes through them at its flush and at its commit.

  /** The top-level transaction of a (possibly nested, savepoint) transaction. */
  #rootOf(trx: Transaction): object {
    let current: object = trx;
    for (let parent = this.#links.parentOf(current); parent !== undefined; parent = this.#links.parentOf(current)) current = parent;
    return current;
  }

  /** True when `trx` or a transaction enclosing it is in `set`. */
  #chainHas(trx: Transaction, set: WeakSet<object>): boolean {
    for (let link: object | undefined = trx; link !== undefined; link = this.#links.parentOf(link)) if (set.has(link)) return true;
    return false;
  }

  #register(events: EventManager): void {
    if (this.#registered.has(events)) return;
    this.#registered.add(events);
    events.registerSubscriber(this.#subscriber);
  }

  /**
   * MikroORM announces no event for em.clear(), which empties the unit of work's identity
   * map and change queues (UnitOfWork.clear(), called only from there): wrap that method
   * on this one unit of work so the rows not flushed yet go with the entity changes.
   */
  #watchClear(em: EntityManager): void {
    const uow = em.getUnitOfWork(false) as unknown as { clear: (...args: unknown[]) => unknown };
    if (this.#watchedClears.has(uow)) return;
    this.#watchedClears.add(uow);
    const clear = uow.clear;
    const pending = this.#pending;
    Object.defineProperty(uow, 'clear', {
      configurable: true,
      writable: true,
      value: function (this: unknown, ...args: unknown[]): unknown {
        pending.delete(em);
        return clear.apply(this, args);
      },
    });
  }

  /**
   * A savepoint's rollback is not announced (MikroORM dispatches transaction events for
   * root transactions only): wrap the knex transaction's rollback so rows flushed inside
   * it are not written by the root's commit.
   */
  #watchSavepoint(trx: Transaction): void {
    const savepoint = trx as unknown as { rollback?: (...args: unknown[]) => unknown };
    if (this.#watchedSavepoints.has(savepoint) || typeof savepoint.rollback !== 'function') return;
    this.#watchedSavepoints.add(savepoint);
    const rollback = savepoint.rollback;
    const rolledBack = this.#rolledBack;
    savepoint.rollback = function (this: unknown, ...args: unknown[]): unknown {
      rolledBack.add(savepoint);
      return rollback.apply(this, args);
    };
  }

  /** Takes the rows of `em` that may be written in `trx`; rows appended in another (ended) transaction are dropped. */
  #take(em: EntityManager, trx: Transaction | undefined): Row[] | undefined {
    const batches = this.#pending.get(em);
    if (!batches) return undefined;
    this.#pending.delete(em);
    // One batch is the common case (every publish of a transaction): its rows, not a copy.
    if (batches.length === 1) return batches[0]!.trx === undefined || batches[0]!.trx === trx ? batches[0]!.rows : undefined;
    const rows: Row[] = [];
    for (const batch of batches) if (batch.trx === undefined || batch.trx === trx) rows.push(...batch.rows);
    return rows.length === 0 ? undefined : rows;
  }

  async #afterFlush(em: EntityManager): Promise<void> {
    const trx = em.getTransactionContext();
    const rows = this.#take(em, trx);
    if (!rows) return;
    if (trx !== undefined) {
      if (this.#links.isCompleted(trx)) {
        throw new ConfigError(`the EntityManager's transaction ended before its outbox rows were written: flush inside the transaction`, {
          code: 'UNIT_OF_WORK_ENDED',
        });
      }
      const root = this.#rootOf(trx);
      if (this.#announced.has(root)) {
        for (let link: object | undefined = trx; link !== root && link !== undefined; link = this.#links.parentOf(link)) this.#watchSavepoint(link as Transaction);
        const deferred = this.#deferred.get(root);
        if (deferred) deferred.push({ trx, rows });
        else this.#deferred.set(root, [{ trx, rows }]);
        return;
      }
      await this.#write(rows, trx);
      this.#written.add(root);
      return;
    }
    await this.#writeAlone(rows);
    this.#committed();
  }

  async #beforeCommit(em: EntityManager, trx: Transaction | undefined): Promise<void> {
    if (trx === undefined) throw new Error('beforeTransactionCommit without a transaction');
    // MikroORM 7 announces a savepoint's release too (not on MySQL/MariaDB): its rows wait
    // for the root's commit, as on 6, where only root transactions are announced.
    if (this.#links.parentOf(trx) !== undefined) return;
    const root = this.#rootOf(trx);
    // The implicit transaction of a flush carries the EntityManager's rows itself; rows
    // appended after em.commit()'s flush still belong to this transaction.
    const own = this.#take(em, trx);
    let batches = this.#deferred.get(root);
    if (own) batches = batches === undefined ? [{ trx, rows: own }] : [...batches, { trx, rows: own }];
    if (batches === undefined) return;
    const rows: Row[] = [];
    for (const batch of batches) if (!this.#chainHas(batch.trx, this.#rolledBack)) rows.push(...batch.rows);
    if (rows.length === 0) {
      this.#deferred.delete(root);
      return;
    }
    // Kept until written: if the write fails and the caller retries the commit (MariaDB
    // keeps a transaction usable after a failed statement), it writes them again rather
    // than committing without them.
    this.#deferred.set(root, batches);
    await this.#write(rows, trx);
    this.#deferred.delete(root);
    this.#written.add(root);
  }

  #afterCommit(trx: Transaction | undefined): void {
    if (trx === undefined || this.#links.parentOf(trx) !== undefined) return;
    const root = this.#rootOf(trx);
    this.#deferred.delete(root);
    if (!this.#written.has(root)) return;
    this.#written.delete(root);
    this.#committed();
  }

  #afterRollback(em: EntityManager, trx: Transaction | undefined): void {
    if (trx !== undefined && this.#links.parentOf(trx) !== undefined) {
      // A savepoint's rollback (announced by MikroORM 7): what was flushed inside it is
      // marked rolled back (TransactionLinks), and what was appended inside it and not
      // flushed goes with it; the enclosing transactions' rows stay.
      const batches = this.#pending.get(em);
      if (batches) {
        const kept = batches.filter((batch) => batch.trx === undefined || !this.#chainHas(batch.trx, this.#rolledBack));
        if (kept.length === 0) this.#pending.delete(em);
        else this.#pending.set(em, kept);
      }
      return;
    }
    this.#pending.delete(em);
    if (trx === undefined) return;
    const root = this.#rootOf(trx);
    this.#deferred.delete(root);
    this.#written.delete(root);
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

function disablesTransactions(em: EntityManager): boolean {
  return (em as unknown as { disableTransactions?: boolean }).disableTransactions === true;
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value !== 'object') return typeof value;
  return value.constructor?.name ?? 'an object';
}
