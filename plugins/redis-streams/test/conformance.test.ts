import { describeTransport } from '@courier/conformance';
import { createRedisStreamsFixture } from './support/fixture.js';

describeTransport('redis-streams', createRedisStreamsFixture, { timeoutMs: 20_000 });
