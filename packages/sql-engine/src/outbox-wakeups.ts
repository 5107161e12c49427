import type { Logger } from '@courier/core';
import type { SqlExecutor } from './executor.js';

/**
 * How the PostgreSQL outbox wakes relays in other processes. Relays in the producing
 * process are always woken in-process, with no database round trip.
 */
export interface PostgresWakeupConfig {
  /**
   * LISTEN on a dedicated connection for `watch()` (re-LISTENed after reconnects).
   * Turn off behind PgBouncer in transaction pooling mode, where LISTEN cannot work; the
   * relay then polls. Default true.
   */
  readonly listen?: boolean;
  /**
   * After a commit that appended rows, send a NOTIFY, coalesced to at most one per
   * `notifyIntervalMs` per process and sent after (never inside) the producer's
   * transaction, so producers do not queue on PostgreSQL's commit-time notify lock.
   * Default true.
   */
  readonly notify?: boolean;
  /** Minimum gap between two NOTIFYs of one process. Default 50 ms. */
  readonly notifyIntervalMs?: number;
}

/** The part of a raw `pg.Client` used for LISTEN. */
interface ListenConnection {
  query(sql: string): Promise<unknown>;
  on(event: 'notification', listener: (message: { channel: string }) => void): unknown;
  on(event: 'error' | 'end', listener: (error?: unknown) => void): unknown;
  removeAllListeners(event?: string): unknown;
}

/** The part of knex's client used to open a connection outside the pool. */
interface RawConnectionSource {
  acquireRawConnection(): Promise<unknown>;
  destroyRawConnection(connection: unknown): Promise<void>;
}

const RECONNECT_MIN_MS = 100;
const RECONNECT_MAX_MS = 5_000;

/**
 * Wake-up signals of one outbox store: in-process listeners, plus on PostgreSQL a
 * coalesced NOTIFY on commit and a LISTEN connection of its own feeding `watch()`.
 *
 * Guarantees: listeners are called asynchronously and never throw into the store; after
 * the LISTEN connection is lost it is re-established with backoff and listeners are
 * called once (anything may have been missed meanwhile); a NOTIFY failure is logged and
 * ignored (the relay's poll is the fallback).
 */
export class OutboxWakeups {
  readonly #runner: SqlExecutor<unknown>;
  readonly #channel: string | undefined;
  readonly #listen: boolean;
  readonly #notify: boolean;
  readonly #intervalMs: number;
  readonly #logger: Logger;
  readonly #source: RawConnectionSource | undefined;
  readonly #listeners = new Set<() => void>();
  #closed = false;
  #lastNotifyAt = 0;
  #notifyTimer: NodeJS.Timeout | undefined;
  #notifying: Promise<void> | undefined;
  #notifyAgain = false;
  #connection: ListenConnection | undefined;
  #connecting: Promise<void> | undefined;
  #reconnectTimer: NodeJS.Timeout | undefined;
  #reconnectDelay = RECONNECT_MIN_MS;

  constructor(options: {
    runner: SqlExecutor<unknown>;
    /** PostgreSQL channel; undefined on other databases (in-process signals only). */
    channel: string | undefined;
    config: PostgresWakeupConfig | false | undefined;
    logger: Logger;
    /** Where LISTEN connections come from (knex's client), if available. */
    source: unknown;
  }) {
    this.#runner = options.runner;
    this.#channel = options.channel;
    const config = options.config === false ? { listen: false, notify: false } : (options.config ?? {});
    this.#listen = options.channel !== undefined && config.listen !== false && isRawConnectionSource(options.source);
    this.#notify = options.channel !== undefined && config.notify !== false;
    this.#intervalMs = config.notifyIntervalMs ?? 50;
    this.#logger = options.logger;
    this.#source = isRawConnectionSource(options.source) ? options.source : undefined;
  }

  /** Rows became claimable through this process: wake local watchers, and other processes (coalesced). */
  signal(): void {
    if (this.#closed) return;
    this.#fire();
    this.#requestNotify();
  }

  /** Adds a listener; opens the LISTEN connection with the first one. */
  async watch(listener: () => void): Promise<() => Promise<void>> {
    const entry = (): void => listener();
    this.#listeners.add(entry);
    if (this.#listen && !this.#connection) {
      try {
        await this.#connect();
      } catch (error) {
        // Not fatal: in-process signals and polling still work; keep trying in the background.
        this.#logger.warn('courier outbox: LISTEN failed, will retry', { error: String(error) });
        this.#scheduleReconnect();
      }
    }
    return async () => {
      this.#listeners.delete(entry);
      if (this.#listeners.size === 0) await this.#disconnect();
    };
  }

  /** Stops timers, sends nothing more, closes the LISTEN connection. Idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#listeners.clear();
    if (this.#notifyTimer) clearTimeout(this.#notifyTimer);
    this.#notifyTimer = undefined;
    await this.#notifying;
    await this.#disconnect();
  }

  #fire(): void {
    for (const listener of this.#listeners) {
      queueMicrotask(() => {
        try {
          listener();
        } catch {
          // A failing listener must not break the store or other listeners.
        }
      });
    }
  }

  #requestNotify(): void {
    if (!this.#notify || this.#closed) return;
    if (this.#notifyTimer || this.#notifying) {
      this.#notifyAgain = true;
      return;
    }
    const wait = this.#lastNotifyAt + this.#intervalMs - Date.now();
    if (wait <= 0) {
      this.#sendNotify();
      return;
    }
    this.#notifyTimer = setTimeout(() => {
      this.#notifyTimer = undefined;
      this.#sendNotify();
    }, wait);
  }

  #sendNotify(): void {
    if (this.#closed || this.#channel === undefined) return;
    this.#notifyAgain = false;
    this.#lastNotifyAt = Date.now();
    this.#notifying = this.#runner
      .all(`SELECT pg_notify(?, '')`, [this.#channel])
      .then(
        () => undefined,
        (error: unknown) => this.#logger.warn('courier outbox: NOTIFY failed; relays will poll', { error: String(error) }),
      )
      .finally(() => {
        this.#notifying = undefined;
        if (this.#notifyAgain) this.#requestNotify();
      });
  }

  #connect(): Promise<void> {
    this.#connecting ??= (async () => {
      const source = this.#source;
      const channel = this.#channel;
      if (!source || channel === undefined) return;
      const connection = (await source.acquireRawConnection()) as ListenConnection;
      if (this.#closed || this.#listeners.size === 0) {
        await source.destroyRawConnection(connection).catch(() => undefined);
        return;
      }
      const lost = (error?: unknown): void => {
        if (this.#connection !== connection) return;
        this.#connection = undefined;
        connection.removeAllListeners('notification');
        this.#logger.warn('courier outbox: LISTEN connection lost, reconnecting', { error: error === undefined ? 'ended' : String(error) });
        void source.destroyRawConnection(connection).catch(() => undefined);
        this.#scheduleReconnect();
      };
      connection.on('notification', (message) => {
        if (message.channel === channel) this.#fire();
      });
      connection.on('error', lost);
      connection.on('end', lost);
      try {
        await connection.query(`LISTEN "${channel}"`);
      } catch (error) {
        // The connection is not ours to keep yet (`lost` ignores it): close it here, or
        // every failed attempt and its retries would leave a server connection open.
        await this.#release(source, connection);
        throw error;
      }
      this.#connection = connection;
      this.#reconnectDelay = RECONNECT_MIN_MS;
    })().finally(() => {
      this.#connecting = undefined;
    });
    return this.#connecting;
  }

  #scheduleReconnect(): void {
    if (this.#closed || this.#listeners.size === 0 || this.#reconnectTimer) return;
    const delay = this.#reconnectDelay;
    this.#reconnectDelay = Math.min(RECONNECT_MAX_MS, this.#reconnectDelay * 2);
    this.#reconnectTimer = setTimeout(() => {
      this.#reconnectTimer = undefined;
      this.#connect().then(
        // Notifications sent while disconnected are lost: wake everyone once.
        () => this.#fire(),
        () => this.#scheduleReconnect(),
      );
    }, delay);
  }

  async #disconnect(): Promise<void> {
    if (this.#reconnectTimer) clearTimeout(this.#reconnectTimer);
    this.#reconnectTimer = undefined;
    await this.#connecting?.catch(() => undefined);
    const connection = this.#connection;
    this.#connection = undefined;
    if (connection && this.#source) await this.#release(this.#source, connection);
  }

  /** Detaches every listener of ours from `connection` and closes it. Never rejects. */
  async #release(source: RawConnectionSource, connection: ListenConnection): Promise<void> {
    connection.removeAllListeners('notification');
    connection.removeAllListeners('error');
    connection.removeAllListeners('end');
    // Keep a no-op error handler: a late socket error must not crash the process.
    connection.on('error', () => undefined);
    await source.destroyRawConnection(connection).catch(() => undefined);
  }
}

function isRawConnectionSource(value: unknown): value is RawConnectionSource {
  return (
    value !== null &&
    typeof value === 'object' &&
    typeof (value as Partial<RawConnectionSource>).acquireRawConnection === 'function' &&
    typeof (value as Partial<RawConnectionSource>).destroyRawConnection === 'function'
  );
}
