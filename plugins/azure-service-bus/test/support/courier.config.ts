// The courier.config.ts the CLI test hands to the `courier` binary: what a Service Bus user
// writes (a transport on a client factory, the consumers and topics whose dead letters the
// CLI reads), with the namespace, entity kind, prefix, topics and consumers taken from env vars.
// It default-exports a plain function, which is what `defineCourierConfig` types: this
// package does not depend on @courier/cli.
import { ServiceBusAdministrationClient, ServiceBusClient } from '@azure/service-bus';
import { ServiceBusTransport } from '../../src/index.js';
import { standInAdministration } from './standin-server.js';

const required = (name: string): string => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (the CLI test sets it)`);
  return value;
};

export default async () => {
  const connectionString = required('ASB_CLI_CONNECTION_STRING');
  const list = (name: string) => required(name).split(',').filter(Boolean);
  // The administration client (reads only: `deadLetters.exists`): the stand-in's management
  // port when the test names one, else the namespace of the connection string.
  const managementPort = Number(process.env['ASB_CLI_MANAGEMENT_PORT']);
  const administration = managementPort > 0 ? standInAdministration(managementPort) : new ServiceBusAdministrationClient(connectionString);
  const transport = new ServiceBusTransport({
    client: () => new ServiceBusClient(connectionString, { retryOptions: { maxRetries: 1, retryDelayInMs: 200, timeoutInMs: 10_000 } }),
    // Topics and subscriptions, or (ASB_CLI_ENTITIES=queues) session-enabled queues.
    entities: process.env['ASB_CLI_ENTITIES'] === 'queues' ? 'queues' : 'topics',
    sessions: true,
    prefix: required('ASB_CLI_PREFIX'),
    topics: list('ASB_CLI_TOPICS'),
    administration,
  });
  return {
    transport,
    consumers: list('ASB_CLI_CONSUMERS'),
    async close() {
      await transport.close();
    },
  };
};
