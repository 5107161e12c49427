import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createSqliteFixture } from './support/fixture.js';

describeOutboxStore('mikro-orm:sqlite', createSqliteFixture);
describeInboxStore('mikro-orm:sqlite', createSqliteFixture);
