import { createInMemoryTransportFixture, describeBus } from '@courier/conformance';
import { createLibsqlFixture } from './support/fixture.js';

// The bus suite's in-process scenarios on @libsql/client with one SQLite file (a crash is an
// error thrown at the fault point; issue 31: every adapter runs them). The SIGKILL scenarios
// run on better-sqlite3 (bus-better-sqlite3-file.test.ts), whose worker processes share a file
// the same way: the engine's SQLite statements and the file locking are the same; what differs
// here — @libsql/client's asynchronous transactions and the append on them — is what these
// in-process runs exercise.
describeBus('sqlite:libsql-file', { store: createLibsqlFixture, transport: createInMemoryTransportFixture }, {
  inProcess: 'throw',
  processSkipReason: 'the SIGKILL scenarios run for better-sqlite3 on a shared file (bus-better-sqlite3-file.test.ts); this driver runs the in-process scenarios',
  stressRuns: 0,
});
