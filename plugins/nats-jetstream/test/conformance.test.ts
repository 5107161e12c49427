import { describeTransport } from '@courier/conformance';
import { createJetStreamFixture } from './support/fixture.js';

describeTransport('jetstream', createJetStreamFixture, { timeoutMs: 20_000 });
