import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createKnexFixture } from './support/fixture.js';

describeInboxStore('knex:mariadb', (context) => createKnexFixture('mariadb', context));
describeOutboxStore('knex:mariadb', (context) => createKnexFixture('mariadb', context));
