// `courier stats --watch` as an operator leaves it open (here into a pipe): the binary as a child process on
// a SQLite outbox, read until it has drawn two refreshes (the second showing a row added
// after the first, so it re-reads rather than repeats) and then a dozen, then stopped with
// SIGINT (Ctrl-C), after which it exits 0 on its own, with nothing on stderr.
import { randomBytes } from 'node:crypto';
import { makeEnvelope } from '@courier/conformance';
import type { EntityManager } from '@mikro-orm/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startCli } from './support/run-cli.js';
import { openStores, type CliTestSetup } from './support/setup.js';

/** What the watch view prints before each refresh on a terminal (never into a pipe, as here). */
const CLEAR = '\x1b[H\x1b[2J';
/** In a pipe each refresh is one plain snapshot ending with its footer line. */
const FOOTER = 'Ctrl-C to quit)\n';

describe('courier stats --watch', () => {
  const prefix = `cliw${randomBytes(4).toString('hex')}_`;
  const env = { CLI_TEST_DIALECT: 'sqlite', CLI_TEST_PREFIX: prefix };
  let stores: CliTestSetup;
  const append = (count: number) =>
    stores.orm.em.fork().transactional(async (em: EntityManager) => {
      stores.outbox.append(em, Array.from({ length: count }, () => ({ envelope: makeEnvelope({ topic: `t${prefix}`, key: null }) })));
    });

  beforeAll(async () => {
    stores = await openStores('sqlite', prefix);
    await stores.outbox.ensureSchema();
  });
  afterAll(async () => {
    await stores?.close();
  });

  it('prints a snapshot at each interval, showing new rows, with no screen escapes in a pipe, and exits 0 on SIGINT', async () => {
    await append(2);
    const child = startCli(['stats', '--watch', '--interval', '300ms'], env);
    let stdout = '';
    let stderr = '';
    const frames = () => stdout.split(FOOTER).slice(0, -1).map((frame) => `${frame}${FOOTER}`);
    let frameArrived: (() => void) | undefined;
    child.stdout!.on('data', (chunk: Buffer) => {
      stdout += chunk.toString();
      frameArrived?.();
    });
    child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
    /** Waits until a complete frame (ending with the footer) satisfies `check`; a child that ends first fails. */
    const frameWhere = async (check: (frame: string) => boolean, timeoutMs = 120_000): Promise<string> => {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const found = frames().find((frame) => frame.includes('Ctrl-C to quit') && check(frame));
        if (found !== undefined) return found;
        if (child.exitCode !== null) throw new Error(`courier exited (${child.exitCode}) before the frame appeared\nstdout: ${stdout}\nstderr: ${stderr}`);
        if (Date.now() > deadline) throw new Error(`no such frame within ${timeoutMs} ms\nstdout: ${stdout}\nstderr: ${stderr}`);
        await new Promise<void>((resolve) => {
          frameArrived = resolve;
          setTimeout(resolve, 500);
        });
      }
    };
    try {
      const pendingOf = (frame: string) => {
        // The outbox table: a header row naming PENDING, then the values in the same columns.
        const lines = frame.split('\n');
        const header = lines.findIndex((line) => /\bPENDING\b/.test(line));
        if (header < 0) return undefined;
        const columns = lines[header]!.trim().split(/\s{2,}/);
        const values = lines[header + 1]!.trim().split(/\s{2,}/);
        return values[columns.indexOf('PENDING')];
      };
      const first = await frameWhere((frame) => pendingOf(frame) !== undefined);
      expect(pendingOf(first)).toBe('2');
      await append(3);
      const second = await frameWhere((frame) => pendingOf(frame) === '5');
      expect(frames().indexOf(second)).toBeGreaterThan(frames().indexOf(first));
      expect(child.exitCode, 'still running after two refreshes').toBeNull();
      // More refreshes than Node's default of ten listeners per signal: a refresh that left
      // its 'abort' listener behind would print a MaxListenersExceededWarning on stderr.
      await frameWhere(() => frames().filter((frame) => frame.includes('Ctrl-C to quit')).length >= 12);
      child.kill('SIGINT');
      const code = await Promise.race([exited, new Promise<'hung'>((resolve) => setTimeout(() => resolve('hung'), 60_000))]);
      expect(code, `exit after SIGINT\nstderr: ${stderr}`).toBe(0);
      expect(stdout).not.toContain(CLEAR);
      expect(stderr).toBe('');
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  });
});
