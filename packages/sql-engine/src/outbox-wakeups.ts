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

/**
 * Where an outbox's LISTEN connection comes from: the small port an adapter implements for
 * {@link OutboxWakeups} (over knex's raw connections for MikroORM, a `pg.Client` of its own
 * for node-postgres; {@link pgClientListenSource} builds one from any pg-like client).
 */
export interface ListenSource {
  /**
   * Opens a dedicated connection (never one of the application's pool: it is held for as
   * long as anyone watches), runs `LISTEN` on `channel` and resolves once it is in effect.
   * Then calls `onNotify` for each notification on `channel`, and `onLost` once when the
   * connection fails or ends (the caller reconnects). Rejects, leaving nothing open, when
   * it cannot listen.
   */
  listen(channel: string, handlers: ListenHandlers): Promise<ListenHandle>;
}

/** What {@link ListenSource.listen} calls. */
export interface ListenHandlers {
  onNotify(): void;
  onLost(error?: unknown): void;
}

/** An open LISTEN connection. */
export interface ListenHandle {
  /** Stops listening and closes the connection; calls no handler afterwards. Never rejects. */
  close(): Promise<void>;
}

/** The part of a node-postgres `Client` (what knex's pg client hands out too) used for LISTEN. */
export interface PgListenClient {
  query(sql: string): Promise<unknown>;
  on(event: 'notification', listener: (message: { channel: string }) => void): unknown;
  on(event: 'error' | 'end', listener: (error?: unknown) => void): unknown;
  removeAllListeners(event?: string): unknown;
}

/**
 * A {@link ListenSource} over pg-like clients: `open` makes a connected client of its own,
 * `close` ends it. Used by the MikroORM adapter (knex's raw connections) and by `@courier/pg`.
 */
export function pgClientListenSource(connections: { open(): Promise<PgListenClient>; close(client: PgListenClient): Promise<void> }): ListenSource {
  return {
    async listen(channel, handlers) {
      const client = await connections.open();
      let open = true;
      const release = async (): Promise<void> => {
        open = false;
        client.removeAllListeners('notification');
        client.removeAllListeners('error');
        client.removeAllListeners('end');
        // Keep a no-op error handler: a late socket error must not crash the process.
        client.on('error', () => undefined);
        await connections.close(client).catch(() => undefined);
      };
      const lost = (error?: unknown): void => {
        if (!open) return;
        void release();
        handlers.onLost(error);
      };
      client.on('notification', (message) => {
        if (open && message.channel === channel) handlers.onNotify();
      });
      client.on('error', lost);
      client.on('end', lost);
      try {
        await client.query(`LISTEN "${channel}"`);
      } catch (error) {
        // Not ours to keep: close it here, or every failed attempt would leave a connection open.
        await release();
        throw error;
      }
      return { close: release };
    },
  };
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
  readonly #source: ListenSource | undefined;
  readonly #listeners = new Set<() => void>();
  #closed = false;
  #lastNotifyAt = 0;
  #notifyTimer: NodeJS.Timeout | undefined;
  #notifying: Promise<void> | undefined;
  #notifyAgain = false;
  #connection: ListenHandle | undefined;
  #connecting: Promise<void> | undefined;
  #reconnectTimer: NodeJS.Timeout | undefined;
  #reconnectDelay = RECONNECT_MIN_MS;

  constructor(options: {
    runner: SqlExecutor<unknown>;
    /** PostgreSQL channel; undefined on other databases (in-process signals only). */
    channel: string | undefined;
    config: PostgresWakeupConfig | false | undefined;
    logger: Logger;
    /** Where LISTEN connections come from, if the adapter has one (without it, in-process signals and polling only). */
    source: ListenSource | undefined;
  }) {
    this.#runner = options.runner;
    this.#channel = options.channel;
    const config = options.config === false ? { listen: false, notify: false } : (options.config ?? {});
    this.#listen = options.channel !== undefined && config.listen !== false && options.source !== undefined;
    this.#notify = options.channel !== undefined && config.notify !== false;
    this.#intervalMs = config.notifyIntervalMs ?? 50;
    this.#logger = options.logger;
    this.#source = options.source;
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
      // Filled once listen resolves: a loss reported before that is the failed attempt's (listen rejects).
      const opened: { handle?: ListenHandle } = {};
      const handle = await source.listen(channel, {
        onNotify: () => this.#fire(),
        onLost: (error) => {
          if (opened.handle === undefined || this.#connection !== opened.handle) return;
          this.#connection = undefined;
          this.#logger.warn('courier outbox: LISTEN connection lost, reconnecting', { error: error === undefined ? 'ended' : String(error) });
          this.#scheduleReconnect();
        },
      });
      opened.handle = handle;
      if (this.#closed || this.#listeners.size === 0) {
        await handle.close();
        return;
      }
      this.#connection = handle;
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
    await connection?.close();
  }
}
