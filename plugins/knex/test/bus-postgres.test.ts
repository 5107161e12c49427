import { createInMemoryTransportFixture, describeBus } from '@courier/conformance';
import { createKnexFixture } from './support/fixture.js';

// The end-to-end bus suite's in-process scenarios on @courier/knex over PostgreSQL (a crash is
// an error thrown at the fault point). The SIGKILL scenarios run on the adapters that own the
// SQL driver (@courier/pg, @courier/mysql2): through Knex the engine issues the same
// statements, and what differs here — running them on the user's transaction object — is
// what these in-process runs exercise.
const processSkipReason = 'the SIGKILL scenarios run for @courier/pg and @courier/mysql2; this adapter runs the in-process scenarios';

describeBus('knex:postgresql', { store: (context) => createKnexFixture('postgresql', context), transport: createInMemoryTransportFixture }, {
  inProcess: 'throw',
  processSkipReason,
});
