// The transport conformance suite in queue mode (`entities: 'queues'`): session-enabled
// queues (every receiver locks sessions; per-key order), and plain queues (peek-lock
// receivers; the ordered cases skip, saying so, since no sessions means no orderingByKey).
// The two-groups case skips in both: a queue has one copy of each message for all its
// receivers (fanOut: false).
import { describeTransport } from '@courier/conformance';
import { afterAll } from 'vitest';
import { createServiceBusFixtureIn } from './support/fixture.js';
import { cleanupNamespace } from './support/namespace.js';

afterAll(cleanupNamespace);

describeTransport('azure-service-bus queues+sessions', (context) => createServiceBusFixtureIn({ entities: 'queues', sessions: true }, context), { timeoutMs: 20_000 });
describeTransport('azure-service-bus queues', (context) => createServiceBusFixtureIn({ entities: 'queues', sessions: false }, context), { timeoutMs: 20_000 });
