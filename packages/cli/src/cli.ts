import { createInterface } from 'node:readline/promises';
import { setTimeout as delay } from 'node:timers/promises';
import { Command, CommanderError, Option } from 'commander';
import { describeError, groupFailures, hasInboxHalts, type InboxHalts, type InboxStats, type OutboxOperations } from '@courier/core';
import { loadConfig, type CourierCliSetup } from './config.js';
import { diagnose, isCourierShaped } from './diagnose.js';
import { actOnParked, countParked, failureFacts, findParked, listParked, listParkedPage, requireDeadLetterPlaces, unreadParkedHeads, unreadTransportLetters, NotFoundError, type ParkedFilter, type ParkedMessage, type ParkingPlaces } from './dead-letters.js';
import { logSlotOf, readLogSlot, renderLogSlot, type CliLogSlot } from './log-slot.js';
import { formatDuration, parseDuration, parsePositiveInt, table, toJson, UsageError } from './format.js';

/** Exit codes of `courier`: documented in the package README and `courier --help`. */
export const EXIT = { ok: 0, failure: 1, usage: 2 } as const;

/** Where the CLI writes; tests and embedders may pass their own. */
export interface CliIo {
  readonly out: (text: string) => void;
  readonly err: (text: string) => void;
  /** Whether a person can answer a confirmation prompt. */
  readonly interactive: boolean;
  readonly cwd: string;
}

const defaultIo: CliIo = {
  out: (text) => process.stdout.write(`${text}\n`),
  err: (text) => process.stderr.write(`${text}\n`),
  interactive: Boolean(process.stdin.isTTY && process.stdout.isTTY),
  cwd: process.cwd(),
};

const EXIT_HELP = `
Exit codes:
  0  done (for --check: the schema is current)
  1  failure: a store or broker error, a reference that does not exist, a schema behind (--check)
  2  usage: a bad option, a config without what the command needs, a destructive command without --yes and no terminal
`;

/**
 * Runs the `courier` command line with `argv` (without node and script) and resolves
 * with the exit code. Expected failures (an unreachable database, a bad option) print one
 * line naming the problem and its remedy, never a stack trace (set COURIER_DEBUG=1 for one).
 */
export async function runCli(argv: readonly string[], io: CliIo = defaultIo): Promise<number> {
  let setup: CourierCliSetup | undefined;
  let exitCode: number = EXIT.ok;
  const open = async (command: string, configPath: string | undefined): Promise<CourierCliSetup> => {
    const config = await loadConfig(configPath, io.cwd);
    try {
      setup = await config({ command });
    } catch (error) {
      throw new ConfigFailure(`the courier config failed while building its objects: ${describeError(error)}`, { cause: error });
    }
    return setup;
  };
  const program = buildProgram(io, open, (code) => {
    exitCode = code;
  });
  try {
    await program.parseAsync([...argv], { from: 'user' });
  } catch (error) {
    exitCode = report(error, io);
  } finally {
    if (setup?.close) {
      try {
        await setup.close();
      } catch (error) {
        io.err(`courier: warning: closing the config's objects failed: ${describeError(error)}`);
      }
    }
  }
  return exitCode;
}

class ConfigFailure extends Error {
  override readonly name = 'ConfigFailure';
}

function report(error: unknown, io: CliIo): number {
  if (error instanceof CommanderError) {
    // Commander printed the message or the help itself.
    return error.code === 'commander.helpDisplayed' || error.code === 'commander.help' || error.code === 'commander.version' ? EXIT.ok : EXIT.usage;
  }
  const debug = process.env['COURIER_DEBUG'] === '1';
  const text = error instanceof Error ? error.message : String(error);
  if (error instanceof UsageError) {
    io.err(`courier: ${text}\n(see \`courier --help\`)`);
    return EXIT.usage;
  }
  const diagnosis = diagnose(error, { fromConfigCode: error instanceof ConfigFailure });
  let exit: number = EXIT.failure;
  if (diagnosis !== undefined) {
    io.err(`courier: ${text}\nremedy: ${diagnosis.remedy}`);
    exit = diagnosis.exit;
  } else if (error instanceof NotFoundError || isCourierShaped(error)) {
    io.err(`courier: ${text}`);
  } else {
    io.err(`courier: unexpected error: ${describeError(error)}`);
    if (!debug && error instanceof Error && error.stack) io.err('(set COURIER_DEBUG=1 for the stack trace)');
  }
  if (debug && error instanceof Error && error.stack) io.err(error.stack);
  return exit;
}

type Opener = (command: string, configPath: string | undefined) => Promise<CourierCliSetup>;

function need<T>(value: T | undefined, what: string): T {
  if (value === undefined) throw new UsageError(`the courier config provides no ${what}; add it to the object your config's function returns`);
  return value;
}

function buildProgram(io: CliIo, open: Opener, setExit: (code: number) => void): Command {
  const program = new Command('courier')
    .description('Operate Courier: outbox backlog, dead letters, halted keys, retention, schema, and the relay as a process of its own.')
    .option('-c, --config <file>', 'config module (default: courier.config.ts|.mts|.js|.mjs in the working directory)')
    .exitOverride()
    .configureOutput({ writeOut: (text) => io.out(text.trimEnd()), writeErr: (text) => io.err(text.trimEnd()) })
    .showHelpAfterError('(add --help for usage)')
    .addHelpText('after', `${EXIT_HELP}
Examples:
  courier stats                       backlog, oldest pending age, dead letters, halted keys
  courier dead list --topic orders    dead outbox rows and transport dead letters of topic 'orders'
  courier migrate --check             exit 1 when the schema is behind (for deploy pipelines)
  courier relay --port 9464           run the relay alone, /health and /metrics on port 9464
  courier console                     the operator console in the browser (read-only without a token)`);
  const configOf = (): string | undefined => program.opts<{ config?: string }>().config;
  const examples = (command: Command, text: string): Command => command.addHelpText('after', `\nExamples:\n${text}\n${EXIT_HELP}`);

  // ── stats ───────────────────────────────────────────────────────────────────────────
  examples(
    program
      .command('stats')
      .description('Show per outbox: pending, oldest pending age, in flight, dead, halted keys; per inbox consumer: records, oldest, dead letters, replayed; per transport: dead letters per consumer.')
      .option('--json', 'print one JSON object (for scripts)')
      .option('--watch', 'refresh in place until Ctrl-C')
      .option('--interval <duration>', 'refresh period of --watch', '2s')
      .action(async (options: { json?: boolean; watch?: boolean; interval: string }) => {
        const interval = parseDuration(options.interval, '--interval');
        const setup = await open('stats', configOf());
        let unavailable: CliStats['unavailable'] = [];
        const render = async (): Promise<string> => {
          const stats = await collectStats(setup);
          unavailable = stats.unavailable;
          return options.json ? toJson(stats) : renderStats(stats);
        };
        if (!options.watch) {
          io.out(await render());
          if (unavailable.length > 0) {
            // What could be read is printed; the exit code still tells a script it is incomplete.
            io.err(`courier: some stats could not be read (listed under "could not read")\n${statsRemedies(unavailable)}`);
            setExit(EXIT.failure);
          }
          return;
        }
        const stop = new AbortController();
        const onSignal = (): void => stop.abort();
        process.once('SIGINT', onSignal);
        process.once('SIGTERM', onSignal);
        try {
          while (!stop.signal.aborted) {
            const text = await render().catch((error: unknown) => `stats failed: ${describeError(error)} (retrying)`);
            // Clear the screen and home the cursor, so the view stays in place — on a terminal
            // only: in a pipe or a file the escapes would be garbage between the snapshots.
            io.out(`${options.json || !io.interactive ? '' : '\x1b[H\x1b[2J'}${text}\n\n(${new Date().toISOString()}, every ${options.interval}; Ctrl-C to quit)`);
            // Node's timer with a signal removes its listener when it ends: a listener added per
            // refresh and never removed piles up (MaxListenersExceededWarning after ten), and
            // one added after a Ctrl-C during the render would hold the exit for an interval.
            await delay(interval, undefined, { signal: stop.signal }).catch(() => undefined);
          }
        } finally {
          process.off('SIGINT', onSignal);
          process.off('SIGTERM', onSignal);
        }
      }),
    `  courier stats
  courier stats --json | jq .outbox.pending
  courier stats --watch --interval 5s`,
  );

  // ── dead ────────────────────────────────────────────────────────────────────────────
  const dead = program
    .command('dead')
    .description(
      "Dead outbox rows (never published), consumers' parked heads (`halted resume --consumer … --park`) and transport dead letters (refused by a consumer): list, groups, show, replay, purge.",
    );
  const filterOptions = (command: Command): Command =>
    command
      .addOption(new Option('--source <where>', "outbox rows, consumers' parked heads (inbox), transport dead letters, or all").choices(['outbox', 'inbox', 'transport', 'all']).default('all'))
      .option('--topic <topic>', 'only this topic')
      .option('--type <type>', 'only this message type')
      .option('--consumer <consumer>', "only this consumer's parked heads and transport dead letters (also one not listed in the config)")
      .option('--code <code>', 'only this error code (e.g. HANDLER_FAILED, PUBLISH_UNROUTABLE)')
      .option('--older-than <duration>', 'only those parked at least this long ago (e.g. 1h)')
      .option('--group <id>', 'only the members of this failure group (the GROUP column of `courier dead groups`)');
  const filterOf = (options: RawFilter): ParkedFilter => ({
    source: options.source,
    ...(options.topic !== undefined ? { topic: options.topic } : {}),
    ...(options.type !== undefined ? { type: options.type } : {}),
    ...(options.consumer !== undefined ? { consumer: options.consumer } : {}),
    ...(options.code !== undefined ? { code: options.code } : {}),
    ...(options.olderThan !== undefined ? { olderThanMs: parseDuration(options.olderThan, '--older-than') } : {}),
    ...(options.group !== undefined ? { group: parseGroupId(options.group) } : {}),
  });
  const placesOf = parkingPlacesOf;

  examples(
    filterOptions(dead.command('list').description("List parked messages a page at a time: outbox rows first, then consumers' parked heads, then transport dead letters; each page ends with the cursor of the next (--after)."))
      .option('--limit <n>', 'most to list (one page)', '100')
      .option('--after <cursor>', 'start after this cursor: the one the previous page printed (or the "cursor" of an item in --json); with the same filters')
      .option('--json', 'print a JSON array; each item carries its "cursor"')
      .action(async (options: RawFilter & { limit: string; after?: string; json?: boolean }) => {
        const limit = parsePositiveInt(options.limit, '--limit');
        const filter = filterOf(options);
        const places = placesOf(await open('dead list', configOf()));
        // Keyset pages (dead-letters.ts): a page never shifts when messages are replayed or
        // purged between pages, and a cut is never silent: the next cursor is printed.
        const page = await listParkedPage(places, filter, { limit, ...(options.after !== undefined ? { after: options.after } : {}) });
        io.out(options.json ? toJson(page.items) : renderParked(page.items));
        if (page.next !== null) {
          // "N of M" only where M is counted, not read (dead-letters.ts, countParked).
          const total = await countParked(places, filter);
          const shown = total === null ? `${page.items.length}${options.after !== undefined ? ' more' : ''} shown` : `${page.items.length}${options.after !== undefined ? ' more' : ''} of ${total} shown`;
          io.err(`courier: ${shown}; more follow: courier dead list --after ${page.next} (with the same filters)`);
        }
        for (const note of [...(await unreadParkedHeads(places, filter)), ...(await unreadTransportLetters(places, page.transportRead))]) io.err(`courier: ${note}`);
      }),
    `  courier dead list
  courier dead list --source transport --consumer payments --code HANDLER_FAILED
  courier dead list --source inbox --consumer billing
  courier dead list --topic orders --older-than 1h --json
  courier dead list --limit 500 --after eyJ...   # the next page: the cursor the previous one printed`,
  );

  examples(
    filterOptions(
      dead
        .command('groups')
        .description('Group parked messages by (type, error code, normalised error, consumer): how many failed the same way, first and last seen. Replay or purge a group with --group <id>.'),
    )
      .option('--json', 'print a JSON array (each group with the references of its members)')
      .action(async (options: RawFilter & { json?: boolean }) => {
        const filter = filterOf(options);
        const places = placesOf(await open('dead groups', configOf()));
        const reads = new Map<string, number>();
        const groups = groupFailures(await listParked(places, filter, Number.MAX_SAFE_INTEGER, reads), failureFacts);
        for (const note of [...(await unreadParkedHeads(places, filter)), ...(await unreadTransportLetters(places, reads))]) io.err(`courier: ${note}`);
        if (options.json) {
          io.out(toJson(groups.map(({ members, ...group }) => ({ ...group, refs: members.map((member) => member.ref) }))));
          return;
        }
        io.out(
          groups.length === 0
            ? 'no dead letters'
            : table(
                ['GROUP', 'COUNT', 'TYPE', 'CODE', 'CONSUMER', 'FIRST SEEN', 'LAST SEEN', 'ERROR'],
                groups.map((group) => [
                  group.id,
                  String(group.count),
                  group.type,
                  group.code ?? '-',
                  group.consumer ?? '(outbox)',
                  group.firstSeen ? `${formatDuration(Date.now() - group.firstSeen.getTime())} ago` : '-',
                  group.lastSeen ? `${formatDuration(Date.now() - group.lastSeen.getTime())} ago` : '-',
                  oneLine(group.error),
                ]),
              ),
        );
      }),
    `  courier dead groups
  courier dead groups --source transport --consumer payments
  courier dead replay --group 3ef380dedc8f --dry-run`,
  );

  examples(
    dead
      .command('show')
      .description('Show parked messages in full: envelope, payload, error.')
      .argument('<ref...>', 'references as `dead list` prints them: outbox:<sequence>, parked:<consumer>:<messageId> or dlq:<consumer>:<id>')
      // Accepted for symmetry with the other commands' --json (scripts pass it everywhere); show always prints JSON.
      .option('--json', 'print a JSON array (what show always prints)')
      .action(async (refs: string[]) => {
        const items = await findParked(placesOf(await open('dead show', configOf())), refs);
        io.out(toJson(items));
      }),
    `  courier dead show outbox:42
  courier dead show parked:billing:0190a1b2-...
  courier dead show dlq:payments:0190a1b2-...`,
  );

  for (const action of ['replay', 'purge'] as const) {
    examples(
      filterOptions(
        dead
          .command(action)
          .description(
            action === 'replay'
              ? "Publish parked messages again with their original messageId: outbox rows become pending, transport dead letters are redelivered to their consumer, a consumer's parked head (parked:…) becomes the head of a resumed halt of its key, which a running instance of the consumer drains (it runs once; behind the key's halt when the key is halted again)."
              : 'Delete parked messages for good (dead outbox rows, consumers\' parked heads, transport dead letters; halted rows must be resumed first).',
          )
          .argument('[ref...]', 'references as `dead list` prints them; or use --all with filters'),
      )
        .option('--all', 'every parked message matching the filters (--group alone needs no --all)')
        .option('--dry-run', 'list what would change, change nothing')
        .option('-y, --yes', 'do not ask for confirmation')
        .action(async (refs: string[], options: RawFilter & { all?: boolean; dryRun?: boolean; yes?: boolean }) => {
          const filter = filterOf(options);
          // A group names its members as exactly as references do, so it needs no --all.
          const bulk = options.all === true || filter.group !== undefined;
          if (refs.length === 0 && !bulk) throw new UsageError(`name what to ${action}: references (outbox:<sequence>, dlq:<consumer>:<id>), --group <id>, or --all with filters`);
          if (refs.length > 0 && bulk) throw new UsageError('give references, or --all/--group with filters, not both');
          const places = placesOf(await open(`dead ${action}`, configOf()));
          const reads = new Map<string, number>();
          const found = bulk ? await listParked(places, filter, Number.MAX_SAFE_INTEGER, reads) : await findParked(places, refs);
          const items = found;
          // A bulk action acts on what could be read: say when that is not everything.
          for (const note of bulk ? [...(await unreadParkedHeads(places, filter)), ...(await unreadTransportLetters(places, reads))] : []) io.err(`courier: ${note}`);
          if (items.length === 0) {
            io.out(`nothing to ${action}`);
            return;
          }
          io.out(renderParked(items));
          if (options.dryRun) {
            io.out(`dry run: would ${action} ${items.length} message(s); nothing changed`);
            return;
          }
          if (!(await confirm(io, options.yes === true, `${action} ${items.length} message(s)?`))) {
            io.out('cancelled; nothing changed');
            setExit(EXIT.failure);
            return;
          }
          const done = await actOnParked(places, items, action);
          io.out(`${action === 'replay' ? 'replayed' : 'purged'} ${done.outbox} outbox row(s), ${done.inbox} parked consumer head(s) and ${done.transport} transport dead letter(s)`);
          if (action === 'replay' && done.inbox > done.heldBehind.length) {
            io.out('replayed parked consumer heads run once a running instance of their consumer drains them (`courier halted list` shows them resumed until then)');
          }
          for (const item of done.heldBehind) {
            io.out(`${item.ref}: its key is halted now; it waits behind that halt (\`courier halted list --consumer ${item.consumer ?? ''}\`)`);
          }
          const changed = done.outbox + done.inbox + done.transport;
          if (changed < items.length) {
            io.err(`courier: ${items.length - changed} of ${items.length} had already changed (another operator, or a relay)`);
          }
        }),
      action === 'replay'
        ? `  courier dead replay outbox:42 dlq:payments:0190a1b2-...
  courier dead replay --all --code PUBLISH_UNROUTABLE --dry-run
  courier dead replay --all --consumer payments --yes
  courier dead replay --group 3ef380dedc8f --yes`
        : `  courier dead purge outbox:42
  courier dead purge --all --older-than 30d --dry-run
  courier dead purge --all --type orders.Legacy --yes`,
    );
  }

  // ── halted ──────────────────────────────────────────────────────────────────────────
  const halted = program.command('halted').description("Keys halted by a poison head: the outbox's (relay, poison 'halt') and every consumer's (ordered subscriptions, poison 'halt'). List them, resume them.");
  const haltedScope = (command: Command): Command =>
    command
      .option('--topic <topic>', 'only this topic')
      .option('--consumer <name>', "only this consumer's halted keys (the inbox store's), not the outbox's")
      .addOption(new Option('--source <where>', "the outbox's halted keys, the consumers', or both").choices(['outbox', 'consumers', 'all']).default('all'));
  examples(
    haltedScope(
      halted
        .command('list')
        .description("List halted keys with their head and how many messages wait behind it: the outbox's, and every consumer's in the inbox store (no need to name them)."),
    )
      .option('--json', 'print a JSON array')
      .action(async (options: HaltedScopeOptions & { json?: boolean }) => {
        const keys = await listHaltedEverywhere(await open('halted list', configOf()), options, io);
        if (options.json) {
          io.out(toJson(keys));
          return;
        }
        io.out(
          keys.length === 0
            ? options.consumer !== undefined
              ? `no halted keys for consumer '${options.consumer}'`
              : 'no halted keys'
            : table(
                ['WHERE', 'TOPIC', 'KEY', 'HEAD', 'HELD', 'RESUMED', 'ERROR'],
                keys.map((key) => [key.consumer === null ? 'outbox' : `consumer ${key.consumer}`, key.topic, key.key, key.headRef, String(key.held), key.resumed ?? '-', oneLine(key.error ?? '')]),
              ),
        );
      }),
    `  courier halted list
  courier halted list --topic orders --json
  courier halted list --consumer billing`,
  );
  examples(
    haltedScope(
      halted
        .command('resume')
        .description(
          'Resume halted keys: retry the head (default), or --park it so the key moves on. Order within the key is kept. Name one key (<topic> <key>, with --consumer for a consumer\'s), or --all with --topic/--consumer/--source. A consumer\'s key is drained by a running instance of that consumer.',
        )
        .argument('[topic]', 'the halted key’s topic')
        .argument('[key]', 'the halted key'),
    )
      .option('--all', 'every halted key matching --topic, --consumer and --source')
      .option('--park', "park the head instead of retrying it: the outbox's becomes a dead outbox row (outbox:<sequence>); a consumer's is kept by the inbox store as a parked head (parked:<consumer>:<messageId>), which `courier dead list/show/groups/replay/purge` take like every dead letter")
      .option('--dry-run', 'show what would be resumed, change nothing')
      .option('-y, --yes', 'do not ask for confirmation')
      .action(async (topic: string | undefined, key: string | undefined, options: HaltedScopeOptions & { all?: boolean; park?: boolean; dryRun?: boolean; yes?: boolean }) => {
        if (options.all && (topic !== undefined || key !== undefined)) throw new UsageError('give <topic> <key>, or --all with filters, not both');
        if (!options.all && (topic === undefined || key === undefined)) throw new UsageError('name the key to resume (<topic> <key>), or use --all with --topic/--consumer/--source');
        const setup = await open('halted resume', configOf());
        const action = options.park ? 'park' : 'retry';
        let targets: HaltedEntry[];
        if (options.all) {
          // A key already resumed is draining: resuming it again would change nothing.
          targets = (await listHaltedEverywhere(setup, options, io)).filter((entry) => entry.resumed === null);
          if (targets.length === 0) {
            io.out('nothing to resume');
            return;
          }
        } else {
          // One named key: the outbox's unless --consumer says whose (the same key may be halted in both).
          const where: HaltedScopeOptions = { ...options, topic: topic!, source: options.consumer !== undefined ? 'consumers' : 'outbox' };
          const found = (await listHaltedEverywhere(setup, where, io)).find((entry) => entry.key === key);
          if (!found) {
            throw new NotFoundError(
              options.consumer !== undefined
                ? `key '${key}' of topic '${topic}' is not halted for consumer '${options.consumer}' (list them with \`courier halted list --consumer ${options.consumer}\`)`
                : `key '${key}' of topic '${topic}' is not halted in the outbox (list them with \`courier halted list\`)`,
            );
          }
          targets = [found];
        }
        io.out(
          table(
            ['WHERE', 'TOPIC', 'KEY', 'HEAD', 'HELD', 'RESUMED', 'ERROR'],
            targets.map((entry) => [entry.consumer === null ? 'outbox' : `consumer ${entry.consumer}`, entry.topic, entry.key, entry.headRef, String(entry.held), entry.resumed ?? '-', oneLine(entry.error ?? '-')]),
          ),
        );
        if (options.dryRun) {
          io.out(`dry run: would ${action} the head of ${targets.length} halted key(s); nothing changed`);
          return;
        }
        if (!(await confirm(io, options.yes === true, `${action} the head of ${targets.length} halted key(s)?`))) {
          io.out('cancelled; nothing changed');
          setExit(EXIT.failure);
          return;
        }
        let resumed = 0;
        for (const entry of targets) {
          const changed = await resumeHaltedEntry(setup, entry, action);
          if (changed > 0) resumed += 1;
          if (entry.consumer === null) {
            io.out(`outbox '${entry.topic}'/'${entry.key}' (${action}): ${changed} row(s) changed`);
          } else {
            io.out(
              changed === 0
                ? `consumer '${entry.consumer}' '${entry.topic}'/'${entry.key}' was already resumed; nothing changed`
                : `resumed consumer '${entry.consumer}' '${entry.topic}'/'${entry.key}' (${action}): a running instance of the consumer drains it${action === 'park' ? `; the head is then listed as parked:${entry.consumer}:${entry.headRef} by \`courier dead list --source inbox\`` : ''}`,
            );
          }
        }
        if (targets.length > 1) io.out(`resumed ${resumed} of ${targets.length} halted key(s) (${action})`);
      }),
    `  courier halted resume orders order-42
  courier halted resume orders order-42 --park --yes
  courier halted resume orders order-42 --consumer billing --yes
  courier halted resume --all --consumer billing --dry-run
  courier halted resume --all --topic orders --yes`,
  );

  // ── console ─────────────────────────────────────────────────────────────────────────
  examples(
    program
      .command('console')
      .description(
        'Serve the operator console, a web page over the same operations as these commands: the backlog with live charts, dead letters grouped by error (replay or purge a group), halted keys (resume). Actions need an operator token; without one it is read-only. Every action is logged to stdout as a JSON line.',
      )
      .option('--port <port>', 'port to listen on (0: any free one)', '9470')
      .option('--host <host>', 'address to listen on (0.0.0.0: every interface; the token then guards actions, not reads)', '127.0.0.1')
      .option('--token <token>', 'operator token required for every action (prefer the COURIER_CONSOLE_TOKEN environment variable: arguments show in ps)')
      .option('--tokens-file <file>', "named tokens, one '<name> <viewer|operator> <token>' a line: every request needs one, audit lines carry the name (instead of --token)")
      .option('--read-only', 'refuse every action, even with a token')
      .option('--interval <duration>', 'how often the overview samples the stats for its charts', '5s')
      .action(async (options: { port: string; host: string; token?: string; tokensFile?: string; readOnly?: boolean; interval: string }) => {
        const port = parsePort(options.port);
        const sampleIntervalMs = parseDuration(options.interval, '--interval');
        const tokensFile = options.tokensFile ?? (process.env['COURIER_CONSOLE_TOKENS_FILE'] || undefined);
        const token = options.token ?? (tokensFile === undefined ? process.env['COURIER_CONSOLE_TOKEN'] || undefined : undefined);
        if (token !== undefined && token.trim() === '') throw new UsageError('--token must not be empty');
        if (token !== undefined && tokensFile !== undefined) throw new UsageError('give --token or --tokens-file, not both');
        // Loaded here only: no other command needs the server.
        const { parseConsoleTokens, serveConsole } = await import('./console-server.js');
        const { readFile } = await import('node:fs/promises');
        const tokens = tokensFile === undefined ? undefined : parseConsoleTokens(await readFile(tokensFile, 'utf8').catch((error: unknown) => Promise.reject(new UsageError(`cannot read --tokens-file '${tokensFile}': ${describeError(error)}`))), tokensFile);
        const setup = await open('console', configOf());
        const running = await serveConsole({ setup, port, host: options.host, token, tokens, readOnly: options.readOnly === true, sampleIntervalMs, audit: (line) => io.out(line) });
        const mode = options.readOnly
          ? 'read-only (--read-only)'
          : tokens !== undefined
            ? `${tokens.length} named tokens (${tokens.filter((one) => one.role === 'operator').length} may act); every request needs one`
            : token === undefined
              ? 'read-only (no operator token: give --token or COURIER_CONSOLE_TOKEN to allow actions)'
              : 'actions need the operator token';
        io.err(`courier console: serving ${running.url} — ${mode}; Ctrl-C to stop`);
        let stop = (): void => undefined;
        const stopped = new Promise<void>((resolve) => (stop = resolve));
        process.once('SIGINT', stop);
        process.once('SIGTERM', stop);
        try {
          await stopped;
        } finally {
          process.off('SIGINT', stop);
          process.off('SIGTERM', stop);
          await running.close();
        }
      }),
    `  courier console                     read-only at http://127.0.0.1:9470/
  COURIER_CONSOLE_TOKEN=… courier console --port 8080
  courier console --read-only --host 0.0.0.0`,
  );

  // ── metrics ─────────────────────────────────────────────────────────────────────────
  examples(
    program
      .command('metrics')
      .description("Read the /metrics and /health of the relays and consumers the config names ('metrics'): which are up, paused or not connected, and publish and handle rates and p99 latencies over a window.")
      .option('--window <duration>', 'time between the two reads the rates are taken over', '10s')
      .option('--json', 'print one JSON object (for scripts)')
      .action(async (options: { window: string; json?: boolean }) => {
        const windowMs = parseDuration(options.window, '--window');
        const { metricsReport, renderMetrics } = await import('./metrics-command.js');
        const report = await metricsReport(await open('metrics', configOf()), windowMs, (ms) => delay(ms));
        io.out(renderMetrics(report, options.json === true));
        // A process that does not answer is what an operator runs this to find: exit 1 tells a script.
        if (report.endpoints.some((read) => !read.up)) setExit(EXIT.failure);
      }),
    `  courier metrics
  courier metrics --window 30s --json | jq .rates`,
  );

  // ── prune ───────────────────────────────────────────────────────────────────────────
  examples(
    program
      .command('prune')
      .description('Delete published outbox rows and inbox records older than a duration, in bounded batches (safe while producers run). The inbox’s age is its deduplication window.')
      .requiredOption('--older-than <duration>', 'age to keep, e.g. 7d')
      .addOption(new Option('--only <what>', 'prune only the outbox or only the inbox').choices(['outbox', 'inbox']))
      .option('--batch-size <n>', 'rows per delete statement (the store’s default when absent)')
      .option('--dry-run', 'say what would be deleted (the cut-off, and the inbox window per consumer where the store reports it), delete nothing')
      .option('-y, --yes', `do not ask for confirmation below the safe window (${formatDuration(SAFE_PRUNE_MS)})`)
      .action(async (options: { olderThan: string; only?: 'outbox' | 'inbox'; batchSize?: string; dryRun?: boolean; yes?: boolean }) => {
        const olderThanMs = parseDuration(options.olderThan, '--older-than');
        const batch = options.batchSize !== undefined ? { batchSize: parsePositiveInt(options.batchSize, '--batch-size') } : {};
        const setup = await open('prune', configOf());
        const outbox = options.only !== 'inbox' ? need(setup.outbox, 'outbox') : undefined;
        const inbox = options.only !== 'outbox' ? setup.inbox : undefined;
        if (options.only === 'inbox') need(setup.inbox, 'inbox');
        const cutoff = new Date(Date.now() - olderThanMs).toISOString();
        if (options.dryRun || (inbox && olderThanMs < SAFE_PRUNE_MS)) {
          if (outbox) io.out(`outbox: would delete published rows older than ${options.olderThan} (published before about ${cutoff})`);
          if (inbox) {
            io.out(`inbox: would delete records older than ${options.olderThan} (recorded before about ${cutoff}): a redelivery of such a message afterwards runs its handler again`);
            const stats = typeof inbox.stats === 'function' ? await inbox.stats() : undefined;
            for (const row of stats?.consumers ?? []) {
              if (row.oldestRecordAgeMs > olderThanMs) io.out(`  consumer '${row.consumer}': ${row.records} record(s), the oldest ${formatDuration(row.oldestRecordAgeMs)} old; its deduplication window shrinks to ${options.olderThan}`);
            }
          }
        }
        if (options.dryRun) {
          io.out('dry run: nothing deleted');
          return;
        }
        // Below a day the inbox forgets what it has already handled within the time a broker
        // may still redeliver it (a retry tier, a parked consumer, a replay), so ask first.
        if (inbox && olderThanMs < SAFE_PRUNE_MS && !(await confirm(io, options.yes === true, `prune the inbox's deduplication window down to ${options.olderThan}?`))) {
          io.out('cancelled; nothing changed');
          setExit(EXIT.failure);
          return;
        }
        if (outbox) io.out(`outbox: pruned ${await outbox.prune(olderThanMs, batch)} published row(s) older than ${options.olderThan}`);
        if (inbox) io.out(`inbox: pruned ${await inbox.prune(olderThanMs, batch)} record(s) older than ${options.olderThan}`);
      }),
    `  courier prune --older-than 7d
  courier prune --older-than 7d --dry-run
  courier prune --older-than 30d --only inbox --batch-size 5000
  courier prune --older-than 1h --only outbox`,
  );

  // ── migrate ─────────────────────────────────────────────────────────────────────────
  examples(
    program
      .command('migrate')
      .description('Create or upgrade Courier’s tables; --print shows the SQL instead, --check exits 1 when the schema is behind.')
      .option('--print', 'print the SQL that would run, run nothing')
      .option('--check', 'exit 1 when the schema is behind this release, 0 when current; change nothing')
      .action(async (options: { print?: boolean; check?: boolean }) => {
        if (options.print && options.check) throw new UsageError('give --print or --check, not both');
        const schema = need((await open('migrate', configOf())).schema, 'schema (e.g. `schema: courierSchemaAdmin({ orm })` from @courier/mikro-orm/migrations)');
        const status = await schema.status();
        if (options.check) {
          if (status.current < status.target) {
            io.err(`courier: the schema is at version ${status.current}, this release needs ${status.target}; run \`courier migrate\``);
            setExit(EXIT.failure);
          } else io.out(`the schema is current (version ${status.current})`);
          return;
        }
        if (options.print) {
          const sql = await schema.pendingSql();
          io.out(sql.length === 0 ? `-- the schema is current (version ${status.current}); nothing to run` : sql.map((statement) => `${statement.trimEnd()};`).join('\n'));
          return;
        }
        if (status.current >= status.target) {
          io.out(`the schema is current (version ${status.current}); nothing to do`);
          return;
        }
        await schema.apply();
        const after = await schema.status();
        io.out(`migrated the schema from version ${status.current} to ${after.current}`);
      }),
    `  courier migrate
  courier migrate --print > courier-schema.sql
  courier migrate --check || exit 1`,
  );

  // ── relay ───────────────────────────────────────────────────────────────────────────
  examples(
    program
      .command('relay')
      .description('Run the relay alone as a long-running process. SIGTERM/SIGINT stops it gracefully: the batch in hand finishes, leases are released. Logs are JSON lines.')
      .option('--port <port>', 'serve /health (200 ready, 503 not) and Prometheus /metrics on this port')
      .option('--host <host>', 'address to listen on with --port (0.0.0.0: every interface; give a token then)', '127.0.0.1')
      .option('--token <token>', 'with --port, require "Authorization: Bearer <token>" (prefer the COURIER_RELAY_TOKEN environment variable: arguments show in ps)')
      .option('--metrics-max-age <duration>', 'with --port, how long one metrics collection answers scrapes', '5s')
      .option('--stop-timeout <duration>', 'longest a graceful stop waits for the batch in hand', '30s')
      .action(async (options: { port?: string; host: string; token?: string; metricsMaxAge: string; stopTimeout: string }) => {
        const port = options.port !== undefined ? parsePort(options.port) : undefined;
        const metricsMaxAgeMs = parseDuration(options.metricsMaxAge, '--metrics-max-age');
        const token = options.token ?? (process.env['COURIER_RELAY_TOKEN'] || undefined);
        if (token !== undefined && token.trim() === '') throw new UsageError('--token must not be empty');
        const stopTimeoutMs = parseDuration(options.stopTimeout, '--stop-timeout');
        // Loaded here only: the metrics SDK and the exporter are not needed by any other command.
        const { runRelay } = await import('./relay-process.js');
        setExit(
          await runRelay({
            // Built inside the relay: a config whose ORM connects at init fails while the
            // database is down, and the relay waits for it (serving /health 503) instead of exiting.
            prepare: async () => {
              const setup = await open('relay', configOf());
              const build = need(setup.relay, 'relay (a function returning { outbox, transport, relay? })');
              return {
                build,
                ...(setup.outbox ? { operations: setup.outbox } : {}),
                ...(setup.inbox ? { inbox: setup.inbox } : {}),
                ...(setup.transport?.deadLetters ? { deadLetters: { deadLetters: setup.transport.deadLetters, consumers: setup.consumers ?? [] } } : {}),
              };
            },
            retryWhen: (error) => diagnose(error)?.kind === 'unreachable',
            port,
            host: options.host,
            token,
            metricsMaxAgeMs,
            stopTimeoutMs,
          }),
        );
      }),
    `  courier relay
  courier relay --port 9464 --stop-timeout 60s
  COURIER_RELAY_TOKEN=… courier relay --port 9464 --host 0.0.0.0`,
  );

  return program;
}

/**
 * Where the config's parked messages live, for the `courier dead` commands and the console:
 * the outbox, the inbox store's parked heads (when it has halts) and the transport's dead
 * letters. Throws a `UsageError` when the config provides none of them.
 */
export function parkingPlacesOf(setup: CourierCliSetup): ParkingPlaces {
  // An inbox store with halts keeps consumers' parked heads; one without has none to show.
  const inbox = setup.inbox && hasInboxHalts(setup.inbox as object) ? (setup.inbox as unknown as InboxHalts) : undefined;
  if (!setup.outbox && !inbox && !setup.transport?.deadLetters) throw new UsageError('the courier config provides neither an outbox, nor an inbox store with halts, nor a transport with dead letters');
  return {
    ...(setup.outbox ? { outbox: setup.outbox } : {}),
    ...(inbox ? { inbox } : {}),
    ...(setup.transport?.deadLetters ? { deadLetters: setup.transport.deadLetters } : {}),
    consumers: setup.consumers ?? [],
  };
}

interface RawFilter {
  source: 'outbox' | 'inbox' | 'transport' | 'all';
  topic?: string;
  type?: string;
  consumer?: string;
  code?: string;
  olderThan?: string;
  group?: string;
}

function parseGroupId(text: string): string {
  if (!/^[0-9a-f]{12}$/i.test(text)) throw new UsageError(`--group '${text}' is not a failure group id (twelve hex digits, as \`courier dead groups\` prints them)`);
  return text.toLowerCase();
}

function parsePort(text: string): number {
  const port = Number(text);
  if (!Number.isInteger(port) || port < 0 || port > 65_535) throw new UsageError(`--port '${text}' is not a port number (0–65535)`);
  return port;
}

async function confirm(io: CliIo, yes: boolean, question: string): Promise<boolean> {
  if (yes) return true;
  if (!io.interactive) throw new UsageError(`refusing to ${question.replace(/\?$/, '')} without confirmation: no terminal to ask on; pass --yes (or --dry-run to look first)`);
  const prompt = createInterface({ input: process.stdin, output: process.stderr });
  try {
    const answer = await prompt.question(`${question} [y/N] `);
    return /^y(es)?$/i.test(answer.trim());
  } finally {
    prompt.close();
  }
}

/** Which halted keys `courier halted` (and the console) look at. */
export interface HaltedScopeOptions {
  topic?: string;
  consumer?: string;
  source: 'outbox' | 'consumers' | 'all';
}

/** One halted key, the outbox's (`consumer` null) or a consumer's, as `courier halted` lists it. */
export interface HaltedEntry {
  readonly consumer: string | null;
  readonly topic: string;
  readonly key: string;
  /** `outbox:<sequence>` for an outbox head; the head's messageId for a consumer's; `-` once dealt with. */
  readonly headRef: string;
  readonly held: number;
  readonly resumed: 'retry' | 'park' | null;
  readonly error: string | null;
  readonly head: unknown;
}

/**
 * Every halted key in scope: the outbox's (paged through `listHalted`) and, through the inbox
 * store's `listHalted` without a consumer, every consumer's — an operator must not have to
 * know which consumers exist to see that one is stuck. A config without an outbox or an inbox
 * with halts skips that half with a note on stderr, unless the scope names it.
 */
export async function listHaltedEverywhere(setup: CourierCliSetup, scope: HaltedScopeOptions, io: Pick<CliIo, 'err'>): Promise<HaltedEntry[]> {
  const entries: HaltedEntry[] = [];
  const wantOutbox = scope.consumer === undefined && scope.source !== 'consumers';
  const wantConsumers = scope.source !== 'outbox';
  if (wantOutbox) {
    if (setup.outbox) {
      for (const key of await listAllHalted(setup.outbox, scope.topic)) {
        entries.push({ consumer: null, topic: key.topic, key: key.key, headRef: `outbox:${key.head.sequence}`, held: key.held, resumed: null, error: key.head.lastError, head: key.head });
      }
    } else if (scope.source === 'outbox') need(setup.outbox, 'outbox');
  }
  if (wantConsumers) {
    const inbox = setup.inbox;
    if (inbox && hasInboxHalts(inbox as object)) {
      const keys = await (inbox as unknown as InboxHalts).listHalted({ ...(scope.consumer !== undefined ? { consumer: scope.consumer } : {}), limit: 100_000 });
      for (const key of keys) {
        if (scope.topic !== undefined && key.topic !== scope.topic) continue;
        entries.push({ consumer: key.consumer, topic: key.topic, key: key.key, headRef: key.head?.envelope.messageId ?? '-', held: key.held, resumed: key.resumed, error: key.head?.error ?? null, head: key.head });
      }
    } else if (scope.consumer !== undefined || scope.source === 'consumers') {
      inboxHalts(inbox);
    } else if (!inbox) {
      io.err("courier: note: the config has no 'inbox', so consumers' halted keys are not listed");
    }
  }
  return entries;
}

/**
 * Resumes one halted key as `courier halted resume` and the console do: the outbox's through
 * `OutboxOperations.resume`, a consumer's through `InboxHalts.resumeHalted` (a running
 * instance of the consumer then drains it). Resolves with how many rows or keys changed: 0
 * when the key had already been resumed (by another operator), so resuming twice is harmless.
 */
export async function resumeHaltedEntry(setup: CourierCliSetup, entry: Pick<HaltedEntry, 'consumer' | 'topic' | 'key'>, action: 'retry' | 'park'): Promise<number> {
  if (entry.consumer === null) return need(setup.outbox, 'outbox').resume(entry.topic, entry.key, action);
  return inboxHalts(setup.inbox).resumeHalted(entry.consumer, entry.topic, entry.key, action);
}

/** The inbox store's halts, or a usage error saying what the config lacks. */
function inboxHalts(inbox: unknown): InboxHalts {
  if (inbox === undefined || inbox === null) throw new UsageError("the courier config provides no 'inbox': --consumer acts on the inbox store's halted keys");
  if (!hasInboxHalts(inbox as object)) throw new UsageError("the configured inbox store has no halts (InboxHalts): no consumer of it can halt keys");
  return inbox as InboxHalts;
}

async function listAllHalted(outbox: OutboxOperations, topic: string | undefined) {
  const all = [];
  let after: bigint | undefined;
  for (;;) {
    const page = await outbox.listHalted({ limit: 500, ...(after !== undefined ? { after } : {}), ...(topic !== undefined ? { topic } : {}) });
    all.push(...page);
    if (page.length < 500) return all;
    after = page[page.length - 1]!.head.sequence;
  }
}

function oneLine(text: string, max = 80): string {
  const flat = text.replace(/\s+/g, ' ');
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
}

function renderParked(items: readonly ParkedMessage[]): string {
  if (items.length === 0) return 'no dead letters';
  return table(
    ['REF', 'STATE', 'TOPIC', 'TYPE', 'KEY', 'CODE', 'ATTEMPTS', 'AGE', 'ERROR'],
    items.map((item) => [
      item.ref,
      item.state,
      item.envelope.topic,
      item.envelope.type,
      item.envelope.key ?? '-',
      item.code ?? '-',
      item.attempts === null ? '-' : String(item.attempts),
      item.parkedAt ? formatDuration(Date.now() - item.parkedAt.getTime()) : '-',
      oneLine(item.error ?? ''),
    ]),
  );
}

/** What `courier stats --json` prints. */
export interface CliStats {
  readonly outbox: { readonly pending: number; readonly oldestPendingAgeMs: number; readonly inFlight: number; readonly dead: number; readonly haltedKeys: number } | null;
  /**
   * Present when the inbox store offers `stats()` (an optional operator member, detected at
   * runtime): per consumer, its records, the oldest one's age, dead-letter marks and replays.
   */
  readonly inbox: InboxStats | null;
  /**
   * Present when the inbox store has halts: per consumer with any halted key (found without
   * naming the consumers), its halted keys and the messages held behind them.
   */
  readonly consumerHalts: readonly { readonly consumer: string; readonly haltedKeys: number; readonly held: number }[] | null;
  /** Present when the outbox tails a replication slot (`@courier/pg-logical`): the slot as the server sees it. */
  readonly logSlot?: CliLogSlot | null;
  /** Consumers' parked heads (`halted resume --park`) per consumer, counted in full: dead letters that need a person. */
  readonly parkedHeads: readonly { readonly consumer: string; readonly parked: number }[] | null;
  /**
   * Dead letters per consumer; `atLeast` when the transport listed its maximum; `noQueue` for
   * a configured consumer the broker has no dead-letter place for while another configured
   * consumer has one (it never subscribed yet). When none has one, the prefix is taken to be
   * mistyped and each is reported under "could not read" (exit 1).
   */
  readonly transport: readonly { readonly consumer: string; readonly deadLetters: number; readonly atLeast: boolean; readonly noQueue?: true }[] | null;
  /**
   * Each configured consumer's lag at the broker (`Transport.consumerLag`: messages waiting,
   * not yet delivered; `waiting: null` when the broker has no queue for it). `available:
   * false` when the transport cannot read it without consuming: shown as "not available".
   * Null without a transport or configured consumers. A consumer whose lag could not be read
   * is under `unavailable`.
   */
  readonly consumerLag: { readonly available: boolean; readonly consumers: readonly { readonly consumer: string; readonly waiting: number | null }[] } | null;
  /**
   * What could not be read (a database or broker away), each with the error: the rest is
   * still reported, so a broker outage does not hide the outbox backlog. Empty when all was read.
   */
  /** The parts that could not be read, each with the remedy for its error where it is a known one. */
  readonly unavailable: readonly { readonly what: string; readonly error: string; readonly remedy?: string }[];
}

const DEPTH_LIMIT = 10_000;

/**
 * The shortest inbox retention `courier prune` applies without asking: a day. Shorter, and a
 * message the broker redelivers later (a long retry tier, a consumer stopped overnight, a
 * replay) is no longer recognised as a duplicate. The outbox alone (`--only outbox`) has no
 * such window: published rows are history.
 */
const SAFE_PRUNE_MS = 86_400_000;

/**
 * Reads what `courier stats` prints (and the console's overview shows): each part on its
 * own, so one that cannot be read is listed under `unavailable` and the rest still reported.
 * Changes nothing.
 */
export async function collectStats(setup: CourierCliSetup): Promise<CliStats> {
  if (!setup.outbox && !setup.inbox && !setup.transport?.deadLetters) throw new UsageError('the courier config provides no outbox, inbox or transport dead letters to report on');
  const unavailable: { what: string; error: string; remedy?: string }[] = [];
  // Each part is read on its own: one failing (the broker down) must not hide the others.
  const read = async <T>(what: string, work: () => Promise<T>): Promise<T | null> => {
    try {
      return await work();
    } catch (error) {
      const remedy = diagnose(error)?.remedy;
      unavailable.push({ what, error: describeError(error), ...(remedy !== undefined ? { remedy } : {}) });
      return null;
    }
  };
  const inbox = setup.inbox;
  const inboxStats = inbox?.stats;
  const deadLetters = setup.transport?.deadLetters;
  let anyPlace: Promise<boolean> | undefined;
  const anyDeadLetterPlace = (): Promise<boolean> =>
    (anyPlace ??= Promise.all((setup.consumers ?? []).map((consumer) => deadLetters!.exists!(consumer))).then((found) => found.includes(true)));
  const slotSource = logSlotOf(setup.outbox);
  const [outbox, logSlot, inboxResult, consumerHalts, transport, parkedHeads] = await Promise.all([
    setup.outbox ? read('outbox', () => setup.outbox!.stats()) : null,
    slotSource ? read(`log-tail slot '${slotSource.slot}'`, () => readLogSlot(slotSource)) : null,
    typeof inboxStats === 'function' ? read('inbox', () => inboxStats.call(inbox)) : null,
    inbox && hasInboxHalts(inbox as object)
      ? read('consumer halted keys', async () => {
          const perConsumer = new Map<string, { consumer: string; haltedKeys: number; held: number }>();
          for (const key of await (inbox as unknown as InboxHalts).listHalted({ limit: 100_000 })) {
            const entry = perConsumer.get(key.consumer) ?? { consumer: key.consumer, haltedKeys: 0, held: 0 };
            entry.haltedKeys += 1;
            entry.held += key.held;
            perConsumer.set(key.consumer, entry);
          }
          return [...perConsumer.values()].sort((a, b) => (a.consumer < b.consumer ? -1 : a.consumer > b.consumer ? 1 : 0));
        })
      : null,
    deadLetters
      ? Promise.all(
          (setup.consumers ?? []).map((consumer) =>
            read(`transport dead letters of '${consumer}'`, async () => {
              // A consumer without a dead-letter place is "no queue yet" when some configured
              // consumer has one (the prefix is right; this one never subscribed), and an
              // error when none has (a mistyped prefix reads as all empty otherwise).
              if (deadLetters.exists && !(await deadLetters.exists(consumer)) && (await anyDeadLetterPlace())) {
                return { consumer, deadLetters: 0, atLeast: false, noQueue: true as const };
              }
              await requireDeadLetterPlaces(deadLetters, [consumer]);
              if (deadLetters.count) return { consumer, deadLetters: await deadLetters.count(consumer), atLeast: false };
              const count = (await deadLetters.list(consumer, { limit: DEPTH_LIMIT })).length;
              return { consumer, deadLetters: count, atLeast: count >= DEPTH_LIMIT };
            }),
          ),
        ).then((rows) => rows.filter((row) => row !== null))
      : null,
    inbox && hasInboxHalts(inbox as object)
      ? read('consumer parked heads', async () => {
          const perConsumer = new Map<string, number>();
          // No limit short of every row: a count that stopped early would hide parked heads.
          for (const head of await (inbox as unknown as InboxHalts).listParked({ limit: Number.MAX_SAFE_INTEGER })) {
            perConsumer.set(head.consumer, (perConsumer.get(head.consumer) ?? 0) + 1);
          }
          return [...perConsumer].map(([consumer, parked]) => ({ consumer, parked })).sort((a, b) => (a.consumer < b.consumer ? -1 : a.consumer > b.consumer ? 1 : 0));
        })
      : null,
  ]);
  const consumerLag = await readConsumerLag(setup, read);
  return { outbox, ...(slotSource ? { logSlot } : {}), inbox: inboxResult, consumerHalts, parkedHeads, transport, consumerLag, unavailable };
}

/** The consumers' lag at the broker, through the transport's passive read (see {@link CliStats.consumerLag}). */
async function readConsumerLag(setup: CourierCliSetup, read: <T>(what: string, work: () => Promise<T>) => Promise<T | null>): Promise<CliStats['consumerLag']> {
  const transport = setup.transport;
  const consumers = setup.consumers ?? [];
  if (!transport || consumers.length === 0) return null;
  if (typeof transport.consumerLag !== 'function') return { available: false, consumers: [] };
  // Wrapped: `read` answers null for a failure, which must not pass for "no queue" (null).
  const rows = await Promise.all(consumers.map((consumer) => read(`lag of '${consumer}' at the broker`, async () => ({ consumer, waiting: await transport.consumerLag!(consumer) }))));
  return { available: true, consumers: rows.filter((row) => row !== null) };
}

/** One `remedy:` line per distinct remedy of the parts `courier stats` could not read. */
function statsRemedies(unavailable: CliStats['unavailable']): string {
  const remedies = [...new Set(unavailable.map((part) => part.remedy ?? 'see the error of each part under "could not read"; COURIER_DEBUG=1 prints its stack'))];
  return remedies.map((remedy) => `remedy: ${remedy}`).join('\n');
}

function renderStats(stats: CliStats): string {
  const lines: string[] = [];
  if (stats.outbox) {
    const o = stats.outbox;
    lines.push('outbox', table(['PENDING', 'OLDEST PENDING', 'IN FLIGHT', 'DEAD', 'HALTED KEYS'], [[String(o.pending), formatDuration(o.oldestPendingAgeMs), String(o.inFlight), String(o.dead), String(o.haltedKeys)]]));
  }
  if (stats.logSlot) lines.push(...(lines.length > 0 ? [''] : []), ...renderLogSlot(stats.logSlot));
  if (stats.inbox) {
    lines.push('', 'inbox');
    lines.push(
      stats.inbox.consumers.length === 0
        ? '(no records)'
        : table(
            ['CONSUMER', 'RECORDS', 'OLDEST', 'DEAD LETTERS', 'REPLAYED'],
            stats.inbox.consumers.map((row) => [row.consumer, String(row.records), formatDuration(row.oldestRecordAgeMs), String(row.deadLetters), String(row.replayed)]),
          ),
    );
  }
  if (stats.consumerHalts) {
    lines.push('', 'consumer halted keys');
    lines.push(
      stats.consumerHalts.length === 0
        ? '(none)'
        : table(['CONSUMER', 'HALTED KEYS', 'MESSAGES HELD'], stats.consumerHalts.map((row) => [row.consumer, String(row.haltedKeys), String(row.held)])),
    );
  }
  if (stats.parkedHeads) {
    lines.push('', 'consumer parked heads');
    lines.push(stats.parkedHeads.length === 0 ? '(none)' : table(['CONSUMER', 'PARKED'], stats.parkedHeads.map((row) => [row.consumer, String(row.parked)])));
  }
  if (stats.transport) {
    lines.push('', 'transport dead letters');
    lines.push(
      stats.transport.length === 0
        ? '(no consumers listed in the config: add `consumers: [...]`)'
        : table(['CONSUMER', 'DEAD LETTERS'], stats.transport.map((row) => [row.consumer, row.noQueue ? 'no queue yet (never subscribed)' : `${row.atLeast ? '≥' : ''}${row.deadLetters}`])),
    );
  }
  if (stats.consumerLag) {
    lines.push('', 'consumer lag at the broker');
    lines.push(
      !stats.consumerLag.available
        ? "not available: this transport cannot read a consumer's lag without consuming"
        : stats.consumerLag.consumers.length === 0
          ? '(could not read; see below)'
          : table(['CONSUMER', 'WAITING'], stats.consumerLag.consumers.map((row) => [row.consumer, row.waiting === null ? 'no queue (never subscribed)' : String(row.waiting)])),
    );
  }
  if (stats.unavailable.length > 0) {
    lines.push('', 'could not read (the rest above is current)');
    for (const { what, error } of stats.unavailable) lines.push(`  ${what}: ${oneLine(error, 160)}`);
  }
  return lines.join('\n');
}
