import { describeError } from '@courier/core';
import { runInProcess } from './in-process-run.js';
import { DISTRIBUTED_SETUPS, parseCommand, USAGE, UsageError, type Command } from './options.js';

const write = (line: string): void => {
  process.stdout.write(`${line}\n`);
};

async function main(): Promise<number> {
  let command: Command;
  try {
    command = parseCommand(process.argv.slice(2));
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    process.stderr.write(`${error.message}\n\n${USAGE}\n`);
    return 2;
  }
  if (command.kind === 'help') {
    write(USAGE);
    return 0;
  }
  if (command.kind === 'worker') {
    const { runWorker } = await import('./worker.js');
    return runWorker(command.role, command.config);
  }
  const { options } = command;
  const result =
    (DISTRIBUTED_SETUPS as readonly string[]).includes(options.setup)
      ? await (await import('./distributed-run.js')).runDistributed(options, write)
      : await runInProcess(options, write);
  return result.ok ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`example failed: ${describeError(error)}\n`);
    if (error instanceof Error && error.stack) process.stderr.write(`${error.stack}\n`);
    process.exit(1);
  },
);
