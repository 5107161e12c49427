import { fileURLToPath } from 'node:url';
import { createInMemoryTransportFixture, describeBus } from '@courier/conformance';
import { createSqliteStoreFixture } from '@courier/mikro-orm/conformance';

// The published store fixture (`@courier/mikro-orm/conformance`, a SQLite file, no server)
// carries the whole bus suite: in-process (a crash is an error thrown at the fault point)
// and the SIGKILL scenarios, whose workers reopen the same file through the fixture module.
describeBus('mikro-orm:sqlite-file', { store: createSqliteStoreFixture, transport: createInMemoryTransportFixture }, {
  inProcess: 'throw',
  process: {
    module: fileURLToPath(new URL('./support/sqlite-file-process-fixture.ts', import.meta.url)),
    execArgv: ['--conditions=@courier/source'],
  },
  // bus-mariadb-sqlite.test.ts runs the random scenarios on SQLite.
  stressRuns: 0,
});
