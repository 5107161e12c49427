// `courier relay` sizes V8's heap itself (issue 40: a relay-only process under 120 MB peak RSS
// without flags the user must know about). V8 reads its heap limits only when the process
// starts (`v8.setFlagsFromString` later does not resize the young generation: tried), so the
// bin replaces its own process image with one started with the flags, before it loads
// anything else.

/**
 * The V8 flags `courier relay` starts itself with, each unless the user sized that part of
 * the heap: semi-spaces of at most 4 MB, and an old generation of at most 256 MB. A relay
 * allocates quickly and keeps little (about 18 MB live after a drain, whatever the backlog).
 * With V8's defaults the young generation alone grows to ~55 MB during a drain (semi-spaces of
 * up to 16 MB on 64-bit), and old space grows to several times the live heap before a full
 * collection, because V8's heap-growing factor rises with the old generation's limit (about
 * 2 GB by default). A 256 MB limit brings that factor down to where old space stays near
 * 25 MB during a drain — the same peak as a 64 MB limit in the bench — while leaving 14 ×
 * the relay's live heap for a config that loads a large application; past it the process
 * ends with an out-of-memory error (the outbox survives it: leases expire, another relay
 * takes the rows), so a relay that needs more sets its own `--max-old-space-size`.
 */
export const RELAY_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=4', '--max-old-space-size=256'];

/** Set in the environment of the re-started process, so it never re-starts again. */
export const RELAY_NODE_FLAGS_MARK = 'COURIER_RELAY_NODE_FLAGS';

/** For each flag of {@link RELAY_NODE_FLAGS}, the flags by which a user sizes that part of the heap themselves. */
const USER_SIZING: Readonly<Record<string, readonly string[]>> = {
  '--max-semi-space-size': ['--max-semi-space-size', '--min-semi-space-size', '--semi-space-growth-factor', '--max-new-space-size', '--max-young-generation-size'],
  '--max-old-space-size': ['--max-old-space-size', '--max-heap-size', '--initial-old-space-size', '--initial-heap-size'],
};

/** The CLI's command: the first argument that is neither an option nor the value of `-c/--config`. */
export function cliCommand(args: readonly string[]): string | undefined {
  for (let index = 0; index < args.length; index += 1) {
    const arg = args[index]!;
    if (arg === '-c' || arg === '--config') {
      index += 1;
      continue;
    }
    if (arg === '--') return args[index + 1];
    if (!arg.startsWith('-')) return arg;
  }
  return undefined;
}

/** The names of the flags in `flags` (`-` and `_` alike, as node reads them). */
function flagNames(flags: readonly string[]): Set<string> {
  return new Set(flags.map((flag) => flag.split('=')[0]!.replace(/_/g, '-')));
}

/**
 * The node arguments to restart this process with so that `courier relay` runs with
 * {@link RELAY_NODE_FLAGS}, or `undefined` to run as it is: for any other command, when the
 * user sized both parts of the heap themselves (in node's arguments or `NODE_OPTIONS`; a flag
 * whose part the user sized is left out), and when this process is already the restarted one
 * (`COURIER_RELAY_NODE_FLAGS` in its environment). `argv` is `process.argv` (node, the
 * script, the CLI's arguments); the result keeps node's own arguments (`execArgv`) first,
 * then the flags, then the script and its arguments.
 */
export function relayRestartArgs(argv: readonly string[], execArgv: readonly string[], env: Readonly<Record<string, string | undefined>>): string[] | undefined {
  if (env[RELAY_NODE_FLAGS_MARK] !== undefined) return undefined;
  if (cliCommand(argv.slice(2)) !== 'relay') return undefined;
  const nodeOptions = (env['NODE_OPTIONS'] ?? '').split(/\s+/).filter((flag) => flag !== '');
  const user = flagNames([...execArgv, ...nodeOptions]);
  const flags = RELAY_NODE_FLAGS.filter((flag) => !(USER_SIZING[flag.split('=')[0]!] ?? []).some((name) => user.has(name)));
  if (flags.length === 0) return undefined;
  return [argv[0]!, ...execArgv, ...flags, ...argv.slice(1)];
}
