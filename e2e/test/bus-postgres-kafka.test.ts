import { fileURLToPath } from 'node:url';
import { describeBus } from '@courier/conformance';
import { kafkaTransport, postgresStore } from './support/fixtures.js';

// PostgreSQL → Kafka → consumer: every fault point in-process (an error thrown there) and
// as SIGKILLed worker processes. A killed consumer's partitions move after the group's
// session timeout (6 s in the fixture), so the process scenarios take a few seconds each.
describeBus('postgresql+kafka', { store: postgresStore, transport: kafkaTransport }, {
  inProcess: 'throw',
  process: {
    module: fileURLToPath(new URL('./support/process-fixture-kafka.ts', import.meta.url)),
    execArgv: ['--conditions=@courier/source'],
  },
});
