import { describeTransport } from '@courier/conformance';
import { createSnsSqsFixture } from './support/fixture.js';

// SNS → SQS: a topic is an SNS topic (the stand-in unless COURIER_SNS_ENDPOINT or real AWS
// is named), each group a queue on the SQS server subscribed with raw delivery. Bounds as
// in conformance.test.ts: the machine is loaded and every delivery is HTTP round trips.
describeTransport('aws sns-sqs', createSnsSqsFixture, { timeoutMs: 60_000 });
describeTransport('aws sns-sqs fifo', (context) => createSnsSqsFixture(context, { fifo: true }), { timeoutMs: 60_000 });
