import { describeInboxStore } from '@courier/conformance';
import { createKyselyFixture } from './support/fixture.js';

describeInboxStore('kysely:sqlite', (context) => createKyselyFixture('sqlite', context));
