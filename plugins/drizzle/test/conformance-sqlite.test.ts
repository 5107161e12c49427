import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createDrizzleFixture } from './support/fixture.js';

describeInboxStore('drizzle:sqlite', (context) => createDrizzleFixture('sqlite', context));
describeOutboxStore('drizzle:sqlite', (context) => createDrizzleFixture('sqlite', context));
