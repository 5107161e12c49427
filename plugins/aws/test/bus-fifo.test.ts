// The bus suite on FIFO SQS queues (the suite's consumer is ordered): MikroORM PostgreSQL
// store, every fault point in-process and as SIGKILLed workers.
import { fileURLToPath } from 'node:url';
import { describeBus } from '@courier/conformance';
import { createPostgresFixture } from '../../mikro-orm/test/support/fixture.js';
import { createSqsFixture } from './support/fixture.js';

describeBus('aws sqs fifo', { store: createPostgresFixture, transport: (context) => createSqsFixture(context, { fifo: true }) }, {
  inProcess: 'throw',
  process: { module: fileURLToPath(new URL('./support/bus-process-fixture-fifo.ts', import.meta.url)), execArgv: ['--conditions=@courier/source'] },
});
