#!/usr/bin/env node
// The `courier` executable: runs the CLI and exits with its code (0 ok, 1 failure, 2 usage).
import { runCli } from './cli.js';
import { exitAfterOutput } from './exit.js';

// Exit explicitly (a config that leaves a pool or socket open must not keep an operator's
// shell waiting), but only once the output has drained into its pipe.
await exitAfterOutput(await runCli(process.argv.slice(2)));
