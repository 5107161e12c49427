import type { ClientBase } from 'pg';

/**
 * PostgreSQL's transaction status of a connection, from the last ReadyForQuery message:
 * `I` idle (no transaction), `T` in a transaction block, `E` in a failed transaction block
 * (every statement is refused until ROLLBACK).
 */
export type TransactionStatus = 'I' | 'T' | 'E';

/** The part of node-postgres's `Connection` (`client.connection`) this reads: it emits every backend message by name. */
interface ProtocolConnection {
  on(event: 'readyForQuery', listener: (message: { status?: unknown }) => void): unknown;
}

interface Tracked {
  status: TransactionStatus | undefined;
  /** Called once when the connection next reports `I`: the transaction that carried outbox rows ended. */
  onIdle: (() => void) | undefined;
}

/**
 * Follows the transaction status node-postgres receives but does not expose: the backend
 * sends it in every ReadyForQuery message (`I`, `T`, `E`), and `pg`'s `Connection` emits
 * that message as a `readyForQuery` event with its `status` (pg 8, pg-protocol). A client
 * is followed from the first time {@link TransactionStatusWatch.status} sees it (or from its
 * creation, for clients of a pool given to {@link TransactionStatusWatch.followPool}).
 *
 * Guarantees: `status` is the status after the last statement the client completed, or
 * `undefined` when it is not known yet (a client seen for the first time, or a client
 * without a protocol connection, such as pg-native's); the caller then checks another way.
 */
export class TransactionStatusWatch {
  readonly #clients = new WeakMap<object, Tracked>();

  /** Follows every client `pool` creates from now on; a new connection starts idle. */
  followPool(pool: { on(event: 'connect', listener: (client: ClientBase) => void): unknown }): void {
    pool.on('connect', (client) => {
      const tracked = this.#follow(client);
      if (tracked && tracked.status === undefined) tracked.status = 'I';
    });
  }

  /** The client's last reported status, `undefined` when not known (it starts being followed now). */
  status(client: ClientBase): TransactionStatus | undefined {
    return this.#follow(client)?.status;
  }

  /** Sets the status learned another way (a probe), until the next ReadyForQuery. */
  learned(client: ClientBase, status: TransactionStatus): void {
    const tracked = this.#follow(client);
    if (tracked) tracked.status = status;
  }

  /**
   * Calls `listener` once, when `client` next reports idle (its transaction committed or
   * rolled back). Returns false when the client's status cannot be followed.
   */
  whenIdle(client: ClientBase, listener: () => void): boolean {
    const tracked = this.#follow(client);
    if (!tracked) return false;
    tracked.onIdle = listener;
    return true;
  }

  #follow(client: ClientBase): Tracked | undefined {
    let tracked = this.#clients.get(client);
    if (tracked) return tracked;
    const connection = (client as unknown as { connection?: Partial<ProtocolConnection> }).connection;
    if (!connection || typeof connection.on !== 'function') return undefined;
    const entry: Tracked = { status: undefined, onIdle: undefined };
    connection.on('readyForQuery', (message) => {
      const status = message.status;
      entry.status = status === 'I' || status === 'T' || status === 'E' ? status : undefined;
      if (entry.status === 'I' && entry.onIdle) {
        const listener = entry.onIdle;
        entry.onIdle = undefined;
        listener();
      }
    });
    this.#clients.set(client, entry);
    tracked = entry;
    return tracked;
  }
}
