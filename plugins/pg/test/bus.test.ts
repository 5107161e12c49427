import { fileURLToPath } from 'node:url';
import { createInMemoryTransportFixture, describeBus } from '@courier/conformance';
import { createPgFixture } from './support/pg-fixture.js';

// The end-to-end bus suite on @courier/pg (PostgreSQL). In-process, a crash is an error
// thrown at the fault point (a frozen transaction would hold its row locks forever); the
// SIGKILL scenarios are the real crashes: workers killed at every point, the database and
// the broker (in the test process, reached over IPC) outlive them. The in-memory broker is
// the cheapest transport that is real to the suite: the transports have their own suites.
describeBus('pg:postgresql', { store: createPgFixture, transport: createInMemoryTransportFixture }, {
  inProcess: 'throw',
  process: {
    module: fileURLToPath(new URL('./support/bus-process-fixture.ts', import.meta.url)),
    execArgv: ['--conditions=@courier/source'],
  },
});
