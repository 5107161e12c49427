// The published SQLite store fixture writes a database file per test into a folder every
// run of the machine shares; the issue-30 author found them piling up with no word on who
// removes them. The test process removes a test's files when its last fixture closes; a
// SIGKILL scenario's worker never does (the parent and later workers still read the file).
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { uniqueId } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { createSqliteStoreFixture } from '../src/conformance.js';

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const cleanup of cleanups.splice(0).reverse()) cleanup();
});

function scratch(): string {
  const directory = mkdtempSync(join(tmpdir(), 'courier-sqlite-fixture-files-'));
  cleanups.push(() => rmSync(directory, { recursive: true, force: true }));
  return directory;
}

/** Opens a fixture and writes through it, so SQLite has its database and WAL files on disk. */
async function openWritten(directory: string, testId: string, keepFiles?: boolean) {
  const fixture = await createSqliteStoreFixture({ testId }, { directory, ...(keepFiles === undefined ? {} : { keepFiles }) });
  await fixture.transaction((tx) => fixture.recordEffect(tx, 'effect-1'));
  return fixture;
}

describe('createSqliteStoreFixture: its files', () => {
  it("removes the test's database, WAL and shared-memory files when the fixture closes", async () => {
    const directory = scratch();
    const testId = uniqueId();
    const fixture = await openWritten(directory, testId);
    expect(readdirSync(directory)).toContain(`${testId}.db`);
    await fixture.close();
    expect(readdirSync(directory)).toEqual([]);
  });

  it('keeps the files while another fixture of the same testId in the process is open, and removes them after the last', async () => {
    const directory = scratch();
    const testId = uniqueId();
    const first = await openWritten(directory, testId);
    const second = await createSqliteStoreFixture({ testId }, { directory });
    await first.close();
    await first.close();
    expect(existsSync(join(directory, `${testId}.db`)), 'closed twice, the first fixture still counts once').toBe(true);
    expect(await second.readEffects()).toEqual(['effect-1']);
    await second.close();
    expect(readdirSync(directory)).toEqual([]);
  });

  it('keeps them in a worker process of the SIGKILL scenarios (COURIER_CONFORMANCE_WORKER set) and with keepFiles', async () => {
    const directory = scratch();
    const inWorker = uniqueId();
    const kept = uniqueId();
    const before = process.env['COURIER_CONFORMANCE_WORKER'];
    process.env['COURIER_CONFORMANCE_WORKER'] = '{}';
    try {
      await (await openWritten(directory, inWorker)).close();
    } finally {
      if (before === undefined) delete process.env['COURIER_CONFORMANCE_WORKER'];
      else process.env['COURIER_CONFORMANCE_WORKER'] = before;
    }
    await (await openWritten(directory, kept, true)).close();
    expect(readdirSync(directory).filter((name) => name.endsWith('.db')).sort()).toEqual([`${inWorker}.db`, `${kept}.db`].sort());
    // A fixture opened again on a kept file finds what was written (what a worker relies on).
    const reopened = await createSqliteStoreFixture({ testId: inWorker }, { directory });
    expect(await reopened.readEffects()).toEqual(['effect-1']);
    await reopened.close();
    expect(existsSync(join(directory, `${inWorker}.db`))).toBe(false);
  });
});
