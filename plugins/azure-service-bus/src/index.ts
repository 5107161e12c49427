export type { ServiceBusAdministration, ServiceBusTransportConfig } from './service-bus-transport.js';
export { ServiceBusTransport, toTransportError } from './service-bus-transport.js';
