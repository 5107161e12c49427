import { fileURLToPath } from 'node:url';
import { createInMemoryTransportFixture, describeBus } from '@courier/conformance';
import { createMysql2Fixture } from './support/fixture.js';

// The end-to-end bus suite on @courier/mysql2 (MariaDB). This adapter's publish returns the
// write's promise, and withTransaction / settleAppends, which the fixture's transactions use,
// also wait for every write started, so the suite's producer runs unchanged. In-process, a crash is
// an error thrown at the fault point (a frozen transaction would hold its InnoDB locks
// forever); the SIGKILL scenarios are the real crashes, with the database and the broker
// (in the test process, reached over IPC) outliving the workers.
describeBus('mysql2:mariadb', { store: createMysql2Fixture, transport: createInMemoryTransportFixture }, {
  inProcess: 'throw',
  process: {
    module: fileURLToPath(new URL('./support/bus-process-fixture.ts', import.meta.url)),
    execArgv: ['--conditions=@courier/source'],
  },
});
