#!/usr/bin/env node
// The `courier` executable: runs the CLI and exits with its code (0 ok, 1 failure, 2 usage).
import { RELAY_NODE_FLAGS, RELAY_NODE_FLAGS_MARK, relayRestartArgs } from './relay-node-flags.js';

// process.execve (node 22.15 / 23.11 and later) is newer than the @types/node this builds against.
type Execve = (file: string, args: readonly string[], env: Record<string, string | undefined>) => never;

// `courier relay` sizes V8's heap itself (relay-node-flags.ts): V8 reads its limits only at
// start-up, so the process replaces itself (same pid, same stdio) with one started with the
// flags, before the CLI is loaded. Where node cannot (Windows; node < 22.15 has no
// process.execve) the relay runs with V8's defaults.
const restart = relayRestartArgs(process.argv, process.execArgv, process.env);
const execve = (process as unknown as { execve?: Execve }).execve;
if (restart !== undefined && process.platform !== 'win32' && typeof execve === 'function') {
  try {
    execve.call(process, process.execPath, restart, { ...process.env, [RELAY_NODE_FLAGS_MARK]: restart.filter((arg) => RELAY_NODE_FLAGS.includes(arg)).join(' ') });
  } catch {
    // Not replaced (the platform refused): run as it is.
  }
}

// Loaded only now: a restarting process never loads them twice.
const { runCli } = await import('./cli.js');
const { exitAfterOutput } = await import('./exit.js');

// Exit explicitly (a config that leaves a pool or socket open must not keep an operator's
// shell waiting), but only once the output has drained into its pipe.
await exitAfterOutput(await runCli(process.argv.slice(2)));
