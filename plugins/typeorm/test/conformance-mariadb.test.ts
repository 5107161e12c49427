import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createTypeOrmFixture } from './support/fixture.js';

describeInboxStore('typeorm:mariadb', (context) => createTypeOrmFixture('mariadb', context));
describeOutboxStore('typeorm:mariadb', (context) => createTypeOrmFixture('mariadb', context));
