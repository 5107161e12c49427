// What differs between MikroORM 6 and 7 for this plugin, kept in one place so the rest of
// the plugin (and the application's code) stays the same on both majors. The peer range
// is still `<7`: README "Supported platforms" lists what MikroORM 7.2.1 still breaks (a
// savepoint has no `parentTransaction` link and a transaction no knex `isCompleted()`, which
// outbox-unit-of-work.ts reads), found by running the plugin's tests on it. Handled here:
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
