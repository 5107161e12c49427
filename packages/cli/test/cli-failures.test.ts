// Expected failures through the compiled `courier` binary, with the README's config
// (ensureDatabase: false, connect: false) on PostgreSQL + RabbitMQ: each names its problem
// and a remedy, with the README's exit code, and none prints "unexpected error" or a stack.
// Before, a missing schema, a refused login, a missing vhost and a permission error all
// printed "unexpected error" (the stores' errors come from the config's own copy of
// @courier/core, loaded through tsx, and failed the CLI's `instanceof CourierError`).
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { MikroORM } from '@mikro-orm/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PACKAGE_DIR, runCli, type CliResult } from './support/run-cli.js';
import { AMQP_URL, openOrm, PG_URL } from './support/setup.js';

const README_CONFIG = join(PACKAGE_DIR, 'test', 'support', 'readme.config.ts');
const id = randomBytes(4).toString('hex');
const prefix = `clifail${id}_`;
/** A role with login and no privilege on anything this test creates: scripts/services.sh creates it. */
const ROLE = 'courier_noperm';

/** `url` with its user (and password), database or port replaced. */
function pgUrl(change: { user?: string; password?: string; database?: string; port?: number }): string {
  const url = new URL(PG_URL);
  if (change.user !== undefined) {
    url.username = change.user;
    url.password = change.password ?? '';
  }
  if (change.database !== undefined) url.pathname = `/${change.database}`;
  if (change.port !== undefined) url.port = String(change.port);
  return url.toString();
}

function amqpUrl(change: { password?: string; port?: number; vhost?: string }): string {
  const url = new URL(AMQP_URL);
  if (change.password !== undefined) url.password = change.password;
  if (change.port !== undefined) url.port = String(change.port);
  if (change.vhost !== undefined) url.pathname = `/${change.vhost}`;
  return url.toString();
}

const run = (args: readonly string[], env: Record<string, string> = {}): Promise<CliResult> =>
  runCli(args, { README_CONFIG_DB_URL: PG_URL, README_CONFIG_PREFIX: prefix, ...env }, 60_000, README_CONFIG);

/** The failure printed one line, then the remedy; nothing "unexpected", no stack trace. */
function expectExplained(result: CliResult, code: number, message: RegExp, remedy: RegExp): void {
  expect(result.code, result.stderr).toBe(code);
  const [first, second] = result.stderr.trim().split('\n');
  expect(first).toMatch(/^courier: /);
  expect(first).toMatch(message);
  expect(second).toMatch(/^remedy: /);
  expect(second).toMatch(remedy);
  expect(result.stderr).not.toContain('unexpected error');
  expect(result.stderr).not.toMatch(/\n\s+at /);
}

describe('courier: expected failures say what is wrong and what to do', () => {
  let orm: MikroORM;
  const sql = (text: string) => orm.em.getConnection().execute(text);

  beforeAll(async () => {
    orm = await openOrm('postgresql', prefix);
    const role = await sql(`SELECT rolname FROM pg_roles WHERE rolname = '${ROLE}'`);
    if (role.length === 0) throw new Error(`PostgreSQL role '${ROLE}' is missing: run \`source scripts/services.sh\` (it creates it as the postgres user)`);
  });
  afterAll(async () => {
    for (const table of ['outbox', 'inbox', 'outbox_halts', 'inbox_halts', 'inbox_parked', 'meta']) await sql(`DROP TABLE IF EXISTS ${prefix}${table} CASCADE`).catch(() => undefined);
    await orm?.close();
  });

  it('the database unreachable: exit 1, start it or fix the address', async () => {
    expectExplained(await run(['dead', 'list', '--source', 'outbox'], { README_CONFIG_DB_URL: pgUrl({ port: 1 }) }), 1, /ECONNREFUSED/, /running and reachable/);
  });

  it('a mistyped database name: exit 1, check the name; the database is not created', async () => {
    const database = `courier_no_such_${id}`;
    expectExplained(await run(['stats', '--json'], { README_CONFIG_DB_URL: pgUrl({ database }) }).then(statsAsFailure), 1, new RegExp(`database "${database}" does not exist`), /database name/);
    expect(await sql(`SELECT datname FROM pg_database WHERE datname = '${database}'`)).toEqual([]);
    expectExplained(await run(['dead', 'list'], { README_CONFIG_DB_URL: pgUrl({ database }) }), 1, new RegExp(`database "${database}" does not exist`), /database name/);
  });

  it('a user the database does not know: exit 1, check the credentials', async () => {
    expectExplained(await run(['halted', 'list'], { README_CONFIG_DB_URL: pgUrl({ user: `nobody_${id}` }) }), 1, /role "nobody_\w+" does not exist/, /user name and password/);
  });

  it('no courier tables under the prefix: exit 1, run courier migrate, on every reading command', async () => {
    for (const args of [['dead', 'list', '--source', 'outbox'], ['halted', 'list'], ['dead', 'groups'], ['prune', '--older-than', '7d', '--dry-run']]) {
      expectExplained(await run(args, { README_CONFIG_PREFIX: `clinone${id}_` }), 1, /schema is missing/, /`courier migrate`/);
    }
  });

  it('a user without privileges on the tables: exit 1, grant them; stats names the remedy for what it could not read', async () => {
    const migrated = await run(['migrate']);
    expect(migrated.code, migrated.stderr).toBe(0);
    const asRole = { README_CONFIG_DB_URL: pgUrl({ user: ROLE, password: ROLE }) };
    expectExplained(await run(['dead', 'list', '--source', 'outbox'], asRole), 1, /permission denied for table/, /lacks a privilege: grant it/);
    const stats = await run(['stats'], asRole);
    expect(stats.code).toBe(1);
    expect(stats.stdout).toContain('could not read');
    expect(stats.stderr).toContain('remedy: the user in your courier config lacks a privilege');
    expect(stats.stderr).not.toContain('running and reachable');
  });

  describe('the broker', () => {
    const broker = (change: Parameters<typeof amqpUrl>[0]) => ({ README_CONFIG_AMQP_URL: amqpUrl(change), README_CONFIG_BROKER_PREFIX: `clifail${id}`, README_CONFIG_CONSUMERS: 'payments' });

    it('unreachable: exit 1, start it or fix the address', async () => {
      expectExplained(await run(['dead', 'list', '--source', 'transport'], broker({ port: 1 })), 1, /ECONNREFUSED/, /running and reachable/);
    });

    it('a refused login: exit 1, check the credentials', async () => {
      expectExplained(await run(['dead', 'list', '--source', 'transport'], broker({ password: `wrong${id}` })), 1, /ACCESS.REFUSED/, /user name and password/);
    });

    it('a virtual host that does not exist: exit 1, check the vhost', async () => {
      expectExplained(await run(['dead', 'list', '--source', 'transport'], broker({ vhost: `nosuch${id}` })), 1, /rabbitmq/, /virtual host/);
    });
  });

  describe('the config file', () => {
    const file = (name: string, text: string): string => {
      const path = join(tmpdir(), `courier-${id}-${name}.config.ts`);
      writeFileSync(path, text);
      return path;
    };

    it('that does not compile, or exports no function: exit 2 (usage), fix the config', async () => {
      for (const [name, text, message] of [
        ['syntax', 'export default (', /failed to load/],
        ['number', 'export default 42;', /must default-export a function/],
      ] as const) {
        expectExplained(await runCli(['stats'], {}, 60_000, file(name, text)), 2, message, /fix the courier config/);
      }
    });

    it("whose own code throws: exit 1, the error is the config's", async () => {
      const throwing = file('throws', `export default () => { throw new Error('vault token expired ${id}'); };`);
      expectExplained(await runCli(['stats'], {}, 60_000, throwing), 1, new RegExp(`vault token expired ${id}`), /your courier config's own code/);
    });
  });
});

/** `courier stats` prints what it could read and the remedies on stderr: as one failure for {@link expectExplained}. */
function statsAsFailure(result: CliResult): CliResult {
  const lines = result.stderr.trim().split('\n');
  const errors = JSON.parse(result.stdout) as { unavailable: { error: string }[] };
  return { ...result, stderr: [`${lines[0]} ${errors.unavailable.map((part) => part.error).join('; ')}`, ...lines.slice(1)].join('\n') };
}
