import { fileURLToPath } from 'node:url';
import { describeBus } from '@courier/conformance';
import { afterAll } from 'vitest';
import { kafkaTransport } from './support/fixtures.js';
import { claimTally, dropLogTailSlots, logTailStore } from './support/log-tail-fixtures.js';
import { SLOT_PREFIX } from './support/process-fixture-log-kafka.js';

// PostgreSQL → Kafka → consumer with the relay tailing the write-ahead log
// (`PgLogicalOutboxStore`, issue 38; Kafka's ordered pipelining makes the relay claim runs
// per key): every fault point in-process and as SIGKILLed worker processes, each worker's
// relay on the test's slot. The consumer-side cases are the polling suite's
// (bus-postgres-kafka.test.ts): the relay is what differs here.
describeBus('postgresql(log-tail)+kafka', { store: (context) => logTailStore(context, SLOT_PREFIX, { readAtOnce: true }), transport: kafkaTransport }, {
  inProcess: 'throw',
  consumerCases: false,
  process: {
    module: fileURLToPath(new URL('./support/process-fixture-log-kafka.ts', import.meta.url)),
    execArgv: ['--conditions=@courier/source'],
  },
});

afterAll(async () => {
  console.log(`[log-tail] in-process relays claimed ${claimTally.logged} rows from the log, ${claimTally.swept} by sweep`);
  await dropLogTailSlots(SLOT_PREFIX);
});
