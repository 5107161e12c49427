export type { CliIo, CliStats } from './cli.js';
export { EXIT, runCli } from './cli.js';
export type { CourierCliSetup, CourierConfig, CourierConfigContext, CourierRelaySetup, SchemaAdmin } from './config.js';
export { CONFIG_FILES, defineCourierConfig, loadConfig } from './config.js';
export type { ParkedFilter, ParkedMessage, ParkedRef } from './dead-letters.js';
export { UsageError, parseDuration } from './format.js';
export type { RunRelayOptions } from './relay-process.js';
export { runRelay } from './relay-process.js';
