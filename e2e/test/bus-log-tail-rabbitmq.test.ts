import { fileURLToPath } from 'node:url';
import { describeBus } from '@courier/conformance';
import { afterAll } from 'vitest';
import { rabbitMqTransport } from './support/fixtures.js';
import { claimTally, dropLogTailSlots, logTailStore } from './support/log-tail-fixtures.js';
import { SLOT_PREFIX } from './support/process-fixture-log-rabbitmq.js';

// PostgreSQL → RabbitMQ → consumer with the relay tailing the write-ahead log
// (`PgLogicalOutboxStore`, issue 38): every fault point in-process (an error thrown there)
// and as SIGKILLed worker processes, each worker's relay on the test's slot. The consumer-side
// cases beside them are the polling suite's (bus-postgres-rabbitmq.test.ts): the relay is
// what differs here.
describeBus('postgresql(log-tail)+rabbitmq', { store: (context) => logTailStore(context, SLOT_PREFIX, { readAtOnce: true }), transport: rabbitMqTransport }, {
  inProcess: 'throw',
  consumerCases: false,
  process: {
    module: fileURLToPath(new URL('./support/process-fixture-log-rabbitmq.ts', import.meta.url)),
    execArgv: ['--conditions=@courier/source'],
  },
});

afterAll(async () => {
  console.log(`[log-tail] in-process relays claimed ${claimTally.logged} rows from the log, ${claimTally.swept} by sweep`);
  await dropLogTailSlots(SLOT_PREFIX);
});
