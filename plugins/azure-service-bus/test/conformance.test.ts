import { describeTransport } from '@courier/conformance';
import { createServiceBusFixture } from './support/fixture.js';

describeTransport('azure-service-bus', createServiceBusFixture, { timeoutMs: 20_000 });
