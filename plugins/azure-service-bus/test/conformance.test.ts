import { describeTransport } from '@courier/conformance';
import { afterAll } from 'vitest';
import { createServiceBusFixture } from './support/fixture.js';
import { cleanupNamespace } from './support/namespace.js';

afterAll(cleanupNamespace);

describeTransport('azure-service-bus', createServiceBusFixture, { timeoutMs: 20_000 });
