import { describeTransport } from '@courier/conformance';
import { createSqsFixture } from './support/fixture.js';

// A killed consumer's messages come back after the 5 s visibility timeout. Every wait is
// bounded at 60 s: at a load average of 45 on the 2-core machine, one instance with
// concurrency 1 took ~2 s a message (a receive and a delete, each an HTTP round trip to a
// starved JVM), and the competing-consumers case did not get 20 messages through in 25 s.
describeTransport('aws sqs', createSqsFixture, { timeoutMs: 60_000 });
describeTransport('aws sqs fifo', (context) => createSqsFixture(context, { fifo: true }), { timeoutMs: 60_000 });
