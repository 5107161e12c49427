import { fileURLToPath } from 'node:url';
import { createInMemoryTransportFixture, describeBus } from '@courier/conformance';
import { createBetterSqlite3Fixture } from './support/fixture.js';

// The whole bus suite on better-sqlite3 with one SQLite file: in-process (a crash is an error
// thrown at the fault point) and the SIGKILL scenarios, whose worker processes open the same
// file with connections of their own.
describeBus('sqlite:better-sqlite3-file', { store: createBetterSqlite3Fixture, transport: createInMemoryTransportFixture }, {
  inProcess: 'throw',
  process: {
    module: fileURLToPath(new URL('./support/bus-process-fixture.ts', import.meta.url)),
    execArgv: ['--conditions=@courier/source'],
  },
  stressRuns: 0,
});
