import { createInMemoryTransportFixture, describeBus } from '@courier/conformance';
import { createMariaDbFixture, createSqliteFixture } from './support/fixture.js';

// The end-to-end bus suite on the other dialects, in-process (a crash is an error thrown
// at the fault point). The SIGKILL scenarios run on PostgreSQL (bus-postgres.test.ts) and
// on PostgreSQL + RabbitMQ (e2e): the claim, lease and inbox SQL they exercise differs per
// dialect only in the adapters these in-process runs already cover.
const processSkipReason = 'the SIGKILL scenarios run against PostgreSQL in bus-postgres.test.ts and e2e/';

describeBus('mikro-orm:mariadb', { store: createMariaDbFixture, transport: createInMemoryTransportFixture }, { inProcess: 'throw', processSkipReason });
describeBus('mikro-orm:sqlite', { store: createSqliteFixture, transport: createInMemoryTransportFixture }, { inProcess: 'throw', processSkipReason });
