import { fileURLToPath } from 'node:url';
import { describeBus } from '@courier/conformance';
import { postgresStore, rabbitMqTransport } from './support/fixtures.js';

// The first real end-to-end: PostgreSQL → RabbitMQ → consumer. In-process a crash is an
// error thrown at the fault point (a frozen PostgreSQL transaction would hold its locks
// forever); the SIGKILL scenarios kill real worker processes at every point.
describeBus('postgresql+rabbitmq', { store: postgresStore, transport: rabbitMqTransport }, {
  inProcess: 'throw',
  process: {
    module: fileURLToPath(new URL('./support/process-fixture.ts', import.meta.url)),
    execArgv: ['--conditions=@courier/source'],
  },
});
