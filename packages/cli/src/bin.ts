#!/usr/bin/env node
// The `courier` executable: runs the CLI and exits with its code (0 ok, 1 failure, 2 usage).
import { runCli } from './cli.js';

// Exit explicitly: a config that leaves a pool or socket open must not keep an operator's shell waiting.
process.exit(await runCli(process.argv.slice(2)));
