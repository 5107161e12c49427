// `courier relay` starts itself with V8 heap limits of its own unless the user sized the heap
// (issue 40: the relay-only process under 120 MB peak RSS without flags the user must know).
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { cliCommand, RELAY_NODE_FLAGS, RELAY_NODE_FLAGS_MARK, relayRestartArgs } from '../src/relay-node-flags.js';
import { PACKAGE_DIR, startCli } from './support/run-cli.js';

const PROBE = join(PACKAGE_DIR, 'test', 'support', 'node-flags.config.mjs');

/** Runs `courier relay` with the probe config; returns what the process that loaded the config reported, and the spawned pid. */
async function probe(env: Record<string, string>): Promise<{ spawned: number; pid: number; execArgv: string[] }> {
  const child = startCli(['relay'], env, PROBE);
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
  const line = stdout.split('\n').find((text) => text.includes('"probe":"node-flags"'));
  expect(line, `stdout: ${stdout}\nstderr: ${stderr}`).toBeDefined();
  // The config's failure ends the relay with an error, after the probe printed.
  expect(code).not.toBe(0);
  return { spawned: child.pid!, ...(JSON.parse(line!) as { pid: number; execArgv: string[] }) };
}

describe('the node flags courier relay gives itself', () => {
  it('restarts relay with the flag after node’s own arguments, and only relay', () => {
    const argv = ['/usr/bin/node', '/app/courier.js', '--config', 'relay.config.ts', 'relay', '--port', '9464'];
    expect(relayRestartArgs(argv, ['--enable-source-maps'], {})).toEqual(['/usr/bin/node', '--enable-source-maps', ...RELAY_NODE_FLAGS, ...argv.slice(1)]);
    expect(relayRestartArgs(['node', 'courier', 'stats'], [], {})).toBeUndefined();
    expect(relayRestartArgs(['node', 'courier', '--config', 'relay', 'stats'], [], {})).toBeUndefined();
    expect(cliCommand(['-c', 'x.ts', 'relay'])).toBe('relay');
    expect(cliCommand(['--version'])).toBeUndefined();
  });

  it('leaves each part of the heap the user sized to the user, and never restarts twice', () => {
    const argv = ['node', 'courier', 'relay'];
    const [young, old] = RELAY_NODE_FLAGS;
    // The young generation sized by the user: only the old-generation limit is added.
    expect(relayRestartArgs(argv, ['--max-semi-space-size=16'], {})).toEqual(['node', '--max-semi-space-size=16', old, 'courier', 'relay']);
    expect(relayRestartArgs(argv, ['--max_semi_space_size=16'], {})).toEqual(['node', '--max_semi_space_size=16', old, 'courier', 'relay']);
    expect(relayRestartArgs(argv, [], { NODE_OPTIONS: '--enable-source-maps --max-semi-space-size=32' })).toEqual(['node', old, 'courier', 'relay']);
    // The old generation sized by the user: only the young-generation limit is added.
    expect(relayRestartArgs(argv, ['--max-old-space-size=512'], {})).toEqual(['node', '--max-old-space-size=512', young, 'courier', 'relay']);
    expect(relayRestartArgs(argv, [], { NODE_OPTIONS: '--max-heap-size=1024' })).toEqual(['node', young, 'courier', 'relay']);
    // Both sized: no restart.
    expect(relayRestartArgs(argv, ['--max-old-space-size=512'], { NODE_OPTIONS: '--max-semi-space-size=8' })).toBeUndefined();
    expect(relayRestartArgs(argv, [], { [RELAY_NODE_FLAGS_MARK]: RELAY_NODE_FLAGS.join(' ') })).toBeUndefined();
  });

  it('runs the relay in the same process (same pid) with the flag, or with the user’s own sizing', { timeout: 120_000 }, async () => {
    const execve = (process as unknown as { execve?: unknown }).execve;
    // node < 22.15 cannot replace its process image: the relay then runs with V8's defaults.
    if (typeof execve !== 'function') return;
    const own = await probe({});
    expect(own.pid).toBe(own.spawned);
    expect(own.execArgv).toEqual(expect.arrayContaining([...RELAY_NODE_FLAGS]));
    const user = await probe({ NODE_OPTIONS: '--max-semi-space-size=32 --max-old-space-size=1024' });
    for (const flag of RELAY_NODE_FLAGS) expect(user.execArgv).not.toContain(flag);
  });
});
