import { describeTransport } from '@courier/conformance';
import { createSqsFixture } from './support/fixture.js';

// A killed consumer's messages come back after the 5 s visibility timeout.
describeTransport('aws sqs', createSqsFixture, { timeoutMs: 25_000 });
describeTransport('aws sqs fifo', (context) => createSqsFixture(context, { fifo: true }), { timeoutMs: 25_000 });
