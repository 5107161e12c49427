import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createPrismaFixture } from './support/fixture.js';

describeInboxStore('prisma:mariadb', (context) => createPrismaFixture('mariadb', context));
describeOutboxStore('prisma:mariadb', (context) => createPrismaFixture('mariadb', context));
