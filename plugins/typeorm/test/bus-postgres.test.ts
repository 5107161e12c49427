import { createInMemoryTransportFixture, describeBus } from '@courier/conformance';
import { createTypeOrmFixture } from './support/fixture.js';

// The end-to-end bus suite's in-process scenarios on @courier/typeorm over PostgreSQL
// (pg; a crash is an error thrown at the fault point). The SIGKILL scenarios run on
// the adapters that own the SQL driver (@courier/pg, @courier/mysql2) and on Prisma: through
// TypeORM the engine issues the same statements, and what differs here — running them on the
// user's EntityManager — is what these in-process runs exercise.
const processSkipReason = 'the SIGKILL scenarios run for @courier/pg, @courier/mysql2 and @courier/prisma; this adapter runs the in-process scenarios';

describeBus('typeorm:postgresql', { store: (context) => createTypeOrmFixture('postgresql', context), transport: createInMemoryTransportFixture }, {
  inProcess: 'throw',
  processSkipReason,
});
