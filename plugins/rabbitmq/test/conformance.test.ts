import { describeTransport } from '@courier/conformance';
import { createRabbitMqFixture } from './support/fixture.js';

// The shared definition of a correct transport, against the RabbitMQ server on the machine.
// `outage` here cuts only this fixture's connections, so the case runs beside the other
// files; the real broker restart (stop_app / start_app) lives in test/restart/.
describeTransport('rabbitmq', (context) => createRabbitMqFixture(context, { outage: 'network' }));
