// The bus suite through SNS → SQS on standard topics and queues (no ordering: the suite's
// consumer is unordered): MikroORM PostgreSQL store, every fault point in-process and as
// SIGKILLed workers, which reach the parent's SNS stand-in through COURIER_SNS_STANDIN_PORT.
import { fileURLToPath } from 'node:url';
import { describeBus } from '@courier/conformance';
import { createPostgresFixture } from '../../mikro-orm/test/support/fixture.js';
import { createSnsSqsFixture, snsProcessScenarios } from './support/fixture.js';

describeBus('aws sns-sqs', { store: createPostgresFixture, transport: createSnsSqsFixture }, {
  inProcess: 'throw',
  tuning: { ordered: false },
  ...snsProcessScenarios(fileURLToPath(new URL('./support/bus-process-fixture-sns.ts', import.meta.url))),
});
