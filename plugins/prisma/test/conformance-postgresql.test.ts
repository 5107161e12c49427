import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createPrismaFixture } from './support/fixture.js';

describeInboxStore('prisma:postgresql', (context) => createPrismaFixture('postgresql', context));
describeOutboxStore('prisma:postgresql', (context) => createPrismaFixture('postgresql', context));
