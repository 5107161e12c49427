import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createPrismaFixture } from './support/fixture.js';

describeInboxStore('prisma:sqlite', (context) => createPrismaFixture('sqlite', context));
describeOutboxStore('prisma:sqlite', (context) => createPrismaFixture('sqlite', context));
