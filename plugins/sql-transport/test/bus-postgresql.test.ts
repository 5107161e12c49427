import { fileURLToPath } from 'node:url';
import { describeBus } from '@courier/conformance';
import { createSqlTransportFixture } from './support/fixture.js';
import { createStoreFixture } from './support/store-fixture.js';

// The whole engine over the SQL transport with the MikroORM store on the same database.
describeBus('sql-postgresql', { store: createStoreFixture('postgresql'), transport: createSqlTransportFixture('postgresql') }, {
  inProcess: 'throw',
  // Workers run the workspace packages from source, like vitest does.
  process: { module: fileURLToPath(new URL('./support/bus-process-postgresql.ts', import.meta.url)), execArgv: ['--conditions=@courier/source'] },
});
