// `courier relay` sizes V8's young generation itself (issue 40: a relay-only process under
// 120 MB peak RSS without flags the user must know about). V8 reads its heap limits only when
// the process starts (`v8.setFlagsFromString` later does not resize the young generation), so
// the bin replaces its own process image with one started with the flag, before it loads
// anything else.

/**
 * The V8 flag `courier relay` starts itself with when the user set none of their own:
 * semi-spaces of at most 4 MB. A relay allocates quickly and keeps little (about 20 MB live
 * after a drain, whatever the backlog): with V8's default (semi-spaces that grow to 16 MB on
 * 64-bit, three of them) the young generation alone grows to ~50 MB during a drain and RSS
 * with it; at 4 MB it stays under 10 MB, scavenges run more often and each is shorter. The
 * old generation keeps V8's default limit: a cap there could end a relay whose config loads
 * a large application with an out-of-memory crash.
 */
export const RELAY_NODE_FLAGS: readonly string[] = ['--max-semi-space-size=4'];

/** Set in the environment of the re-started process, so it never re-starts again. */
export const RELAY_NODE_FLAGS_MARK = 'COURIER_RELAY_NODE_FLAGS';

/** The heap flags that, when the user gives any of them, leave V8's sizing to the user. */
const USER_HEAP_FLAGS = ['--max-semi-space-size', '--min-semi-space-size', '--semi-space-growth-factor', '--max-new-space-size', '--max-young-generation-size'];

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

/** Whether `text` (execArgv or NODE_OPTIONS) already sizes V8's young generation (`-` and `_` alike, as node reads them). */
function setsYoungGeneration(flags: readonly string[]): boolean {
  return flags.some((flag) => {
    const name = flag.split('=')[0]!.replace(/_/g, '-');
    return USER_HEAP_FLAGS.includes(name);
  });
}

/**
 * The node arguments to restart this process with so that `courier relay` runs with
 * {@link RELAY_NODE_FLAGS}, or `undefined` to run as it is: for any other command, when the
 * user sized the young generation (in node's arguments or `NODE_OPTIONS`), and when this
 * process is already the restarted one (`COURIER_RELAY_NODE_FLAGS` in its environment).
 * `argv` is `process.argv` (node, the script, the CLI's arguments); the result keeps node's
 * own arguments (`execArgv`) first, then the flag, then the script and its arguments.
 */
export function relayRestartArgs(argv: readonly string[], execArgv: readonly string[], env: Readonly<Record<string, string | undefined>>): string[] | undefined {
  if (env[RELAY_NODE_FLAGS_MARK] !== undefined) return undefined;
  if (cliCommand(argv.slice(2)) !== 'relay') return undefined;
  const nodeOptions = (env['NODE_OPTIONS'] ?? '').split(/\s+/).filter((flag) => flag !== '');
  if (setsYoungGeneration(execArgv) || setsYoungGeneration(nodeOptions)) return undefined;
  return [argv[0]!, ...execArgv, ...RELAY_NODE_FLAGS, ...argv.slice(1)];
}
