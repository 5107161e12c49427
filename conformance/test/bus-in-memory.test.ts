import { describeBus } from '../src/bus-suite.js';
import { createInMemoryStoreFixture, createInMemoryTransportFixture } from '../src/in-memory-fixtures.js';

// In-memory transactions hold no locks, so a frozen worker is a faithful in-process
// crash. Nothing in memory outlives a process, so the SIGKILL scenarios cannot apply.
describeBus('in-memory', { store: createInMemoryStoreFixture, transport: createInMemoryTransportFixture }, {
  inProcess: 'freeze',
  processSkipReason: 'in-memory state dies with the process; the MikroORM and RabbitMQ suites run these',
});
