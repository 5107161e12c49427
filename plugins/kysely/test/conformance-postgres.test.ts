import { describeInboxStore } from '@courier/conformance';
import { createKyselyFixture } from './support/fixture.js';

describeInboxStore('kysely:postgresql', (context) => createKyselyFixture('postgresql', context));
