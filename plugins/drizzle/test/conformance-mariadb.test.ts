import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createDrizzleFixture } from './support/fixture.js';

describeInboxStore('drizzle:mariadb', (context) => createDrizzleFixture('mariadb', context));
describeOutboxStore('drizzle:mariadb', (context) => createDrizzleFixture('mariadb', context));
