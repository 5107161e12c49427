export type { CourierModuleAsyncOptions, CourierModuleOptions, CourierModuleRootOptions, CourierOptionsFactory, CourierStartOptions } from './courier-module-options.js';
export { CourierModule } from './courier-module.js';
export type { CourierLifecycle } from './courier-lifecycle.js';
export type { OnMessageMetadata, OnMessageMethod, OnMessageOptions } from './on-message.js';
export { ON_MESSAGE_METADATA, OnMessage, onMessageMetadata } from './on-message.js';
export { DEFAULT_BUS_NAME, InjectBus, getBusToken, getCourierOptionsToken } from './tokens.js';
export { nestLogger } from './nest-logger.js';
export type { CourierCliSetupOptions } from './cli-setup.js';
export { courierCliSetup } from './cli-setup.js';
