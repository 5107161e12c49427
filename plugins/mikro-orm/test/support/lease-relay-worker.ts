// The relay process of the lease-heartbeat test: a bus over the test's PostgreSQL outbox
// whose transport takes a batch and never answers (a broker whose confirms hang), so the
// relay holds its claimed batch until the parent SIGKILLs it. Prints `HELD <ids>` once the
// batch is in the transport's hands.
import { createBus, InMemoryBroker, type Transport } from '@courier/core';
import { createMikroOrmFixture } from './fixture.js';

const config = JSON.parse(process.env['COURIER_LEASE_WORKER'] ?? '{}') as { testId: string; leaseMs?: number };
const fixture = await createMikroOrmFixture('postgresql', { testId: config.testId });
const connection = new InMemoryBroker().connect();
const hanging: Transport = {
  capabilities: { ...connection.capabilities, orderedPipelining: false },
  publish(messages) {
    process.stdout.write(`HELD ${JSON.stringify(messages.map((message) => message.messageId))}\n`);
    return new Promise(() => {});
  },
  subscribe: (endpoint, handler) => connection.subscribe(endpoint, handler),
  close: () => connection.close(),
};
const bus = createBus({
  outbox: fixture.outbox,
  transport: hanging,
  relay: { batchSize: 500, pollIntervalMs: 100, ...(config.leaseMs === undefined ? {} : { leaseMs: config.leaseMs }) },
});
await bus.start({ consumers: false });
process.stdout.write('STARTED\n');
