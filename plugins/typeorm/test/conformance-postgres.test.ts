import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createTypeOrmFixture } from './support/fixture.js';

describeInboxStore('typeorm:postgresql', (context) => createTypeOrmFixture('postgresql', context));
describeOutboxStore('typeorm:postgresql', (context) => createTypeOrmFixture('postgresql', context));
