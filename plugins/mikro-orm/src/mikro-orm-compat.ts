// What differs between MikroORM 6 and 7 for this plugin, kept in one place so the rest of
// the plugin (and the application's code) stays the same on both majors. Found by running
// the plugin's own test files on 7.2.1 (plugins/mikro-orm-7). Handled here:
//   - transactions: 6's are knex's (a savepoint links to its enclosing transaction through
//     `parentTransaction`, and `isCompleted()` says whether it ended); 7's are kysely's
//     `ControlledTransaction`s, with `isCommitted` / `isRolledBack` on a top-level one and,
//     on a savepoint, neither a link to its enclosing transaction nor a state that its
//     release or rollback changes. {@link TransactionLinks} restores both from what 7
//     announces (see there), so outbox-unit-of-work.ts follows one model on both majors;
//   - the libsql driver's options: MikroORM 6 hands `driverOptions.connection` to knex, which
//     opens libsql's `Database` with it; MikroORM 7 (knex replaced by kysely) opens it with
//     `driverOptions` itself, and ignores `driverOptions.connection`;
//   - MikroORM 7 drivers have no knex client, so `SqlRunner.configureEveryConnection` finds
//     none to hook and leaves the connection as it is: a local libsql file keeps one
//     connection for the ORM's life there (6 replaced it every 10 s), which opened with the
//     timeout above;
//   - MikroORM 7 is ESM only: the lazy `require('@mikro-orm/core')` in outbox-unit-of-work.ts
//     loads it through Node's require(esm) (Node 22.12+; 7 itself needs 22.17+), which hands
//     back the module instance the application imported.
import { createRequire } from 'node:module';

/** A MikroORM major this plugin supports. */
export type MikroOrmMajor = 6 | 7;

let installed: MikroOrmMajor | undefined;

/**
 * The major version of the `@mikro-orm/core` this package resolves (the application's peer
 * dependency), read once from its package.json; anything from 7 on counts as 7.
 */
export function mikroOrmMajor(): MikroOrmMajor {
  if (installed === undefined) {
    const { version } = createRequire(import.meta.url)('@mikro-orm/core/package.json') as { version: string };
    installed = Number.parseInt(version, 10) >= 7 ? 7 : 6;
  }
  return installed;
}

/**
 * `driverOptions` for `@mikro-orm/libsql` with libsql's busy `timeout` (milliseconds) where
 * the given MikroORM major passes it to libsql: `driverOptions.connection.timeout` on 6,
 * `driverOptions.timeout` on 7. A timeout already set there wins; nothing is modified.
 */
export function libsqlDriverOptionsWithTimeout(
  driverOptions: Readonly<Record<string, unknown>>,
  connection: Readonly<Record<string, unknown>>,
  timeout: number,
  major: MikroOrmMajor,
): Record<string, unknown> {
  if (major === 6) return { ...driverOptions, connection: { timeout, ...connection } };
  return { timeout, ...driverOptions };
}

/**
 * The transaction facts outbox-unit-of-work.ts needs, on MikroORM 6 (knex) and 7 (kysely):
 * a savepoint's enclosing transaction, and whether a transaction has ended.
 *
 * On 7 a savepoint (`em.transactional()` inside a transaction, or `em.begin()` in one) is a
 * new kysely transaction object that only shares the connection. MikroORM 7 announces its
 * start to the EntityManager that opens it: `beforeTransactionStart` with the enclosing
 * transaction, then `afterTransactionStart` with the savepoint, both for the same
 * EntityManager (a transactional fork of its own, or the EntityManager of `em.begin()`), so
 * {@link beforeStart} / {@link afterStart} pair them per EntityManager — concurrent
 * transactions of other EntityManagers cannot interleave. Its release and rollback are not
 * reliably announced (the MySQL/MariaDB driver releases a savepoint without any event), so
 * the savepoint's own `releaseSavepoint` / `rollbackToSavepoint`, which MikroORM 7 calls
 * on it for both, are wrapped to record that it ended. On 6 knex links and tracks these
 * itself and nothing is recorded.
 */
export class TransactionLinks {
  readonly #parents = new WeakMap<object, object>();
  readonly #opening = new WeakMap<object, object>();
  readonly #ended = new WeakSet<object>();
  readonly #onRollback: (savepoint: object) => void;

  /** `onRollback` is told about every savepoint of 7 rolled back, as it happens. */
  constructor(onRollback: (savepoint: object) => void) {
    this.#onRollback = onRollback;
  }

  /** `beforeTransactionStart` of `em`: `enclosing` is the transaction a savepoint opens in (none for a top-level one). */
  beforeStart(em: object, enclosing: object | undefined): void {
    if (enclosing === undefined) this.#opening.delete(em);
    else this.#opening.set(em, enclosing);
  }

  /** `afterTransactionStart` of `em`: links a savepoint of 7 to the transaction {@link beforeStart} saw. */
  afterStart(em: object, trx: object | undefined): void {
    const enclosing = this.#opening.get(em);
    this.#opening.delete(em);
    if (enclosing === undefined || trx === undefined || !('savepointName' in trx) || knexParent(trx) !== undefined) return;
    this.#parents.set(trx, enclosing);
    const savepoint = trx as { releaseSavepoint?: (...args: unknown[]) => unknown; rollbackToSavepoint?: (...args: unknown[]) => unknown };
    const ended = this.#ended;
    const onRollback = this.#onRollback;
    const release = savepoint.releaseSavepoint;
    const rollback = savepoint.rollbackToSavepoint;
    // The command is built, then executed: marked when built, since a failed RELEASE or
    // ROLLBACK TO leaves the savepoint unusable all the same.
    if (typeof release === 'function') {
      savepoint.releaseSavepoint = function (this: unknown, ...args: unknown[]): unknown {
        ended.add(trx);
        return release.apply(this, args);
      };
    }
    if (typeof rollback === 'function') {
      savepoint.rollbackToSavepoint = function (this: unknown, ...args: unknown[]): unknown {
        ended.add(trx);
        onRollback(trx);
        return rollback.apply(this, args);
      };
    }
  }

  /** The enclosing transaction of a savepoint, or undefined for a top-level transaction. */
  parentOf(trx: object): object | undefined {
    return knexParent(trx) ?? this.#parents.get(trx);
  }

  /** True when `trx` (or, for a savepoint, a transaction enclosing it) has committed or rolled back. */
  isCompleted(trx: object): boolean {
    for (let link: object | undefined = trx; link !== undefined; link = this.parentOf(link)) if (this.#ended.has(link) || ownStateEnded(link)) return true;
    return false;
  }
}

function knexParent(trx: object): object | undefined {
  const parent = (trx as { parentTransaction?: unknown }).parentTransaction;
  return parent === undefined || parent === null ? undefined : (parent as object);
}

/** knex's `isCompleted()` (6), kysely's `isCommitted` / `isRolledBack` (7, top-level transactions only). */
function ownStateEnded(trx: object): boolean {
  const state = trx as { isCompleted?: () => boolean; isCommitted?: unknown; isRolledBack?: unknown };
  if (typeof state.isCompleted === 'function') return state.isCompleted();
  return state.isCommitted === true || state.isRolledBack === true;
}
