import { createInMemoryStoreFixture, createInMemoryTransportFixture, describeInboxStore, describeOutboxStore, describeTransport } from '@courier/conformance';

describeOutboxStore('in-memory', (context) => createInMemoryStoreFixture(context));
describeInboxStore('in-memory', (context) => createInMemoryStoreFixture(context));
describeTransport('in-memory', (context) => createInMemoryTransportFixture(context));
