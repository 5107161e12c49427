// The bus suite through SNS → SQS on FIFO topics and FIFO queues (the suite's consumer is
// ordered: MessageGroupId = key end to end): MikroORM PostgreSQL store, every fault point
// in-process and as SIGKILLed workers, which reach the parent's SNS stand-in through
// COURIER_SNS_STANDIN_PORT.
import { fileURLToPath } from 'node:url';
import { describeBus } from '@courier/conformance';
import { createPostgresFixture } from '../../mikro-orm/test/support/fixture.js';
import { createSnsSqsFixture, snsProcessScenarios } from './support/fixture.js';

describeBus('aws sns-sqs fifo', { store: createPostgresFixture, transport: (context) => createSnsSqsFixture(context, { fifo: true }) }, {
  inProcess: 'throw',
  ...snsProcessScenarios(fileURLToPath(new URL('./support/bus-process-fixture-sns-fifo.ts', import.meta.url))),
});
