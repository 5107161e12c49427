import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createDrizzleFixture } from './support/fixture.js';

describeInboxStore('drizzle:postgresql', (context) => createDrizzleFixture('postgresql', context));
describeOutboxStore('drizzle:postgresql', (context) => createDrizzleFixture('postgresql', context));
