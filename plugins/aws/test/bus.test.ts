// The bus suite on standard SQS queues (no ordering: the suite's consumer is unordered):
// MikroORM PostgreSQL store, every fault point in-process and as SIGKILLed workers.
import { fileURLToPath } from 'node:url';
import { describeBus } from '@courier/conformance';
import { createPostgresFixture } from '../../mikro-orm/test/support/fixture.js';
import { createSqsFixture } from './support/fixture.js';

describeBus('aws sqs', { store: createPostgresFixture, transport: createSqsFixture }, {
  inProcess: 'throw',
  tuning: { ordered: false },
  // Workers run the workspace packages from source, like vitest does.
  process: { module: fileURLToPath(new URL('./support/bus-process-fixture.ts', import.meta.url)), execArgv: ['--conditions=@courier/source'] },
});
