import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createKyselyFixture } from './support/fixture.js';

describeInboxStore('kysely:sqlite', (context) => createKyselyFixture('sqlite', context));
describeOutboxStore('kysely:sqlite', (context) => createKyselyFixture('sqlite', context));
