import { createInMemoryTransportFixture, describeBus } from '@courier/conformance';
import { createDrizzleFixture } from './support/fixture.js';

// The end-to-end bus suite's in-process scenarios on @courier/drizzle over PostgreSQL
// (node-postgres; a crash is an error thrown at the fault point). The SIGKILL scenarios run on
// the adapters that own the SQL driver (@courier/pg, @courier/mysql2) and on Prisma: through
// Drizzle the engine issues the same statements, and what differs here — running them on the
// user's Drizzle transaction — is what these in-process runs exercise.
const processSkipReason = 'the SIGKILL scenarios run for @courier/pg, @courier/mysql2 and @courier/prisma; this adapter runs the in-process scenarios';

describeBus('drizzle:postgresql', { store: (context) => createDrizzleFixture('postgresql', context), transport: createInMemoryTransportFixture }, {
  inProcess: 'throw',
  processSkipReason,
});
