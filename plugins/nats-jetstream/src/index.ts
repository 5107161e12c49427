export type { NatsJetStreamTransportOptions } from './nats-jetstream-transport.js';
export { NatsJetStreamTransport } from './nats-jetstream-transport.js';
