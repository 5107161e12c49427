import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createMySqlDriverFixture } from './support/fixture.js';

describeOutboxStore('mikro-orm:mysql-driver', createMySqlDriverFixture);
describeInboxStore('mikro-orm:mysql-driver', createMySqlDriverFixture);
