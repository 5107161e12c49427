import { fileURLToPath } from 'node:url';
import { createInMemoryTransportFixture, describeBus } from '@courier/conformance';
import { createPostgresDeletingFixture } from './support/fixture.js';

// The bus suite of bus-postgres.test.ts with an outbox that deletes rows at completion
// (`publishedRows: 'delete'`): the same in-process scenarios, and the SIGKILL scenarios with
// workers whose fixture reads the mode from the environment they inherit.
process.env['COURIER_STORE_DIALECT'] = 'postgresql';
process.env['COURIER_STORE_PUBLISHED_ROWS'] = 'delete';

describeBus('mikro-orm:postgresql, publishedRows delete', { store: createPostgresDeletingFixture, transport: createInMemoryTransportFixture }, {
  inProcess: 'throw',
  process: {
    module: fileURLToPath(new URL('./support/bus-process-fixture.ts', import.meta.url)),
    execArgv: ['--conditions=@courier/source'],
  },
});
