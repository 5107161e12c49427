import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { ConfigError, type InboxOperations, type Logger, type OutboxOperations, type OutboxStore, type RelayConfig, type Transport, type TransportDeadLetters } from '@courier/core';
import { UsageError } from './format.js';
import type { MetricsEndpoint } from './metrics-read.js';

/**
 * What `courier migrate` needs from a store plugin: the schema version it finds, the SQL
 * that would bring it up to date, and a way to apply it. Plugin-agnostic, so every store
 * can offer one (`@courier/mikro-orm/migrations` exports `courierSchemaAdmin`).
 *
 * Guarantees an implementation keeps: `status` and `pendingSql` change nothing;
 * `pendingSql` is empty exactly when `status` reports `current === target`; `apply` is
 * idempotent and safe to run from several processes at once.
 */
export interface SchemaAdmin {
  status(): Promise<{ readonly current: number; readonly target: number }>;
  pendingSql(): Promise<readonly string[]>;
  apply(): Promise<void>;
}

/**
 * What `courier relay` runs: the same outbox store and transport the service uses, and
 * its relay settings. The CLI builds a bus with them and starts only its relay.
 */
export interface CourierRelaySetup<Tx> {
  readonly outbox: OutboxStore<Tx>;
  readonly transport: Transport;
  readonly relay?: RelayConfig;
  readonly onKeyHalted?: (topic: string, key: string, error: string) => void;
}

/**
 * The objects one CLI run works with, built by the user's config. Every member is
 * optional: a command that needs a missing one fails with a usage error naming it.
 *
 * The CLI depends on the operator halves of the ports only (`OutboxOperations`,
 * `InboxOperations`, the transport's `deadLetters`), so any present or future plugin fits.
 * It looks for further optional operator members at runtime (an inbox with `stats()`
 * shows in `courier stats`), so a store that grows them is picked up without a new
 * config contract.
 */
export interface CourierCliSetup {
  /** The outbox's operator half; any `OutboxStore` is one. */
  readonly outbox?: OutboxOperations;
  /** The inbox's operator half; any `InboxStore` is one. */
  readonly inbox?: InboxOperations;
  /** The transport (outside `courier relay` only its `deadLetters` and `consumerLag` are used: operator reads). */
  readonly transport?: { readonly deadLetters?: TransportDeadLetters; consumerLag?(consumer: string): Promise<number | null> };
  /**
   * The consumer (group) names whose transport dead letters the CLI looks at: a transport
   * keeps dead letters per consumer and cannot list its consumers itself.
   */
  readonly consumers?: readonly string[];
  /**
   * The `/metrics` and `/health` endpoints of the relays and consumers (`courier relay --port`,
   * `serveCourierMetrics`) that `courier metrics` and the console read for rates, latencies
   * and which processes are alive: a base URL each, or `{ url, name?, token? }`.
   */
  readonly metrics?: readonly (string | MetricsEndpoint)[];
  /** Schema status and migration for `courier migrate`. */
  readonly schema?: SchemaAdmin;
  /**
   * Builds the relay wiring for `courier relay`; called only by that command, so the other
   * commands never open a broker connection for it.
   */
  readonly relay?: (logger: Logger) => CourierRelaySetup<unknown> | Promise<CourierRelaySetup<unknown>>;
  /** Closes what the config opened (ORM, connections); awaited once when the command ends. */
  close?(): Promise<void>;
}

/** Per-run facts handed to the config function. */
export interface CourierConfigContext {
  /** The command being run, e.g. `stats` or `dead replay`. */
  readonly command: string;
}

/**
 * The default export of `courier.config.ts|.js|.mjs`: a function (sync or async) building
 * the objects of one CLI run. It runs once per command, and `close` once after it.
 */
export type CourierConfig = (context: CourierConfigContext) => CourierCliSetup | Promise<CourierCliSetup>;

/**
 * Types a `courier.config.ts` default export: `export default defineCourierConfig(async () => ({ outbox, inbox, ... }))`.
 * Returns its argument unchanged; it exists so the config is checked against {@link CourierCliSetup}.
 */
export function defineCourierConfig(config: CourierConfig): CourierConfig {
  return config;
}

/** File names looked for in the working directory when `--config` is not given, in order. */
export const CONFIG_FILES = ['courier.config.ts', 'courier.config.mts', 'courier.config.js', 'courier.config.mjs'] as const;

/**
 * Finds and imports the config module. TypeScript configs load without a build step
 * through tsx's `tsImport` (scoped to this one import: no global loader is registered).
 * Throws a `UsageError` (exit 2) when there is no such file, and a `ConfigError` naming the
 * file and what is wrong with it when it cannot be loaded.
 */
export async function loadConfig(path: string | undefined, cwd: string = process.cwd()): Promise<CourierConfig> {
  const file = path !== undefined ? resolve(cwd, path) : CONFIG_FILES.map((name) => resolve(cwd, name)).find((candidate) => existsSync(candidate));
  if (file === undefined) {
    throw new UsageError(`no courier config found in '${cwd}' (looked for ${CONFIG_FILES.join(', ')}); create one or pass --config <file>`);
  }
  // A path that names nothing is a usage error (exit 2), like a bad option: nothing was tried.
  if (!existsSync(file)) throw new UsageError(`config file '${file}' does not exist; pass --config <file> with the path of your courier.config.ts`);
  const url = pathToFileURL(file).href;
  let module: { default?: unknown };
  try {
    if (/\.[mc]?ts$/.test(file)) {
      const { tsImport } = await import('tsx/esm/api');
      module = (await tsImport(url, import.meta.url)) as { default?: unknown };
    } else {
      module = (await import(url)) as { default?: unknown };
    }
  } catch (error) {
    // One line: the compiler's message spans several ("Transform failed with 1 error:\n<file>:2:0: ERROR: …").
    const reason = (error instanceof Error ? error.message : String(error)).replace(/\s*\n\s*/g, ' ');
    throw new ConfigError(`config file '${file}' failed to load: ${reason}`, { cause: error });
  }
  // tsx may wrap a CommonJS-looking module's exports once more.
  let exported = module.default;
  if (exported !== null && typeof exported === 'object' && typeof (exported as { default?: unknown }).default === 'function') {
    exported = (exported as { default: unknown }).default;
  }
  if (typeof exported !== 'function') {
    throw new ConfigError(`config file '${file}' must default-export a function (use \`export default defineCourierConfig(async () => ({ ... }))\`)`);
  }
  return exported as CourierConfig;
}
