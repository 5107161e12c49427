import { fileURLToPath } from 'node:url';
import { createInMemoryTransportFixture, describeBus } from '@courier/conformance';
import { createPrismaFixture } from './support/fixture.js';

// In-process, a crash is an error thrown at the fault point: a frozen PostgreSQL
// transaction would hold its row locks forever. The SIGKILL scenarios are the real
// crashes: workers are killed at every point, the database outlives them.
describeBus('prisma:postgresql', { store: (context) => createPrismaFixture('postgresql', context), transport: createInMemoryTransportFixture }, {
  inProcess: 'throw',
  // The random stress runs repeat the fault points above with other seeds; MikroORM's bus suite
  // runs them on the same engine. Here they would add minutes to CI for little new.
  stressRuns: 0,
  process: {
    module: fileURLToPath(new URL('./support/bus-process-fixture.ts', import.meta.url)),
    execArgv: ['--conditions=@courier/source'],
  },
});
