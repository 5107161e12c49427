import { describeInboxStore } from '@courier/conformance';
import { createKnexFixture } from './support/fixture.js';

describeInboxStore('knex:sqlite', (context) => createKnexFixture('sqlite', context));
