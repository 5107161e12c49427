import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createKnexFixture } from './support/fixture.js';

describeInboxStore('knex:postgresql', (context) => createKnexFixture('postgresql', context));
describeOutboxStore('knex:postgresql', (context) => createKnexFixture('postgresql', context));
