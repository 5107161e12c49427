import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createKnexFixture } from './support/fixture.js';

describeInboxStore('knex:sqlite', (context) => createKnexFixture('sqlite', context));
describeOutboxStore('knex:sqlite', (context) => createKnexFixture('sqlite', context));
