import { describeTransport } from '@courier/conformance';
import { createKafkaFixture } from './support/fixture.js';

// Redelivery after a killed connection waits for the group's session timeout (6 s here) and a rebalance.
describeTransport('kafka', createKafkaFixture, { timeoutMs: 25_000 });
