import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createKyselyFixture } from './support/fixture.js';

describeInboxStore('kysely:postgresql', (context) => createKyselyFixture('postgresql', context));
describeOutboxStore('kysely:postgresql', (context) => createKyselyFixture('postgresql', context));
