import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createKyselyFixture } from './support/fixture.js';

describeInboxStore('kysely:mariadb', (context) => createKyselyFixture('mariadb', context));
describeOutboxStore('kysely:mariadb', (context) => createKyselyFixture('mariadb', context));
