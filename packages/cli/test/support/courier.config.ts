// The courier.config.ts the CLI tests hand to the binary: what a user writes, with the
// test's database, table prefix, broker prefix and queue limits taken from env vars.
import { defineCourierConfig } from '@courier/cli';
import { openStores, openTransport, queueLimitsFromEnv, type Dialect } from './setup.js';

export default defineCourierConfig(async () => {
  const dialect = (process.env['CLI_TEST_DIALECT'] ?? 'postgresql') as Dialect;
  const prefix = process.env['CLI_TEST_PREFIX'] ?? 'cli_';
  const stores = await openStores(dialect, prefix, process.env['CLI_TEST_DB_URL']);
  const brokerPrefix = process.env['CLI_TEST_BROKER_PREFIX'];
  const transport = brokerPrefix ? await openTransport(brokerPrefix, queueLimitsFromEnv()) : undefined;
  return {
    outbox: stores.outbox,
    inbox: stores.inbox,
    schema: stores.schema,
    // CLI_TEST_METRICS: a JSON array of the endpoints `courier metrics` and the console read.
    ...(process.env['CLI_TEST_METRICS'] ? { metrics: JSON.parse(process.env['CLI_TEST_METRICS']) as string[] } : {}),
    ...(transport ? { transport, consumers: (process.env['CLI_TEST_CONSUMERS'] ?? '').split(',').filter(Boolean) } : {}),
    relay: async () => {
      if (!brokerPrefix) throw new Error('CLI_TEST_BROKER_PREFIX is not set');
      // CLI_TEST_RELAY_MAX_ATTEMPTS: a test that wants messages dead at their first failure.
      const maxAttempts = Number(process.env['CLI_TEST_RELAY_MAX_ATTEMPTS'] ?? 10);
      return {
        outbox: stores.outbox,
        transport: await openTransport(brokerPrefix, queueLimitsFromEnv()),
        relay: { batchSize: 50, pollIntervalMs: 200, retry: { maxAttempts, initialDelayMs: 200, maxDelayMs: 1_000 } },
      };
    },
    async close() {
      await transport?.close();
      await stores.close();
    },
  };
});
