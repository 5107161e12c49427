import { createInMemoryTransportFixture, describeBus } from '@courier/conformance';
import { createKyselyFixture } from './support/fixture.js';

// The end-to-end bus suite's in-process scenarios on @courier/kysely over PostgreSQL (a crash is
// an error thrown at the fault point). The SIGKILL scenarios run on the adapters that own the
// SQL driver (@courier/pg, @courier/mysql2): through Kysely the engine issues the same
// statements, and what differs here — running them on the user's transaction object — is
// what these in-process runs exercise.
const processSkipReason = 'the SIGKILL scenarios run for @courier/pg and @courier/mysql2; this adapter runs the in-process scenarios';

describeBus('kysely:postgresql', { store: (context) => createKyselyFixture('postgresql', context), transport: createInMemoryTransportFixture }, {
  inProcess: 'throw',
  processSkipReason,
});
