import { Inject } from '@nestjs/common';

/** The name of the bus `CourierModule.forRoot()` registers when no `name` is given. */
export const DEFAULT_BUS_NAME = 'default';

/**
 * The injection token of the bus named `name` (default {@link DEFAULT_BUS_NAME}), for
 * `moduleRef.get(getBusToken())`, a custom provider's `inject`, or a test's
 * `overrideProvider`. One token per name, so several buses live side by side.
 */
export function getBusToken(name: string = DEFAULT_BUS_NAME): string {
  return `CourierBus:${name}`;
}

/** The injection token of the options the bus named `name` was built from. */
export function getCourierOptionsToken(name: string = DEFAULT_BUS_NAME): string {
  return `CourierModuleOptions:${name}`;
}

/**
 * Injects the bus named `name` (default {@link DEFAULT_BUS_NAME}): type the parameter as
 * `Bus<Tx>` from `@courier/core`, with `Tx` your stores' unit of work (MikroORM's
 * `EntityManager`, …). An explicit token, so it works with compilers that emit no
 * decorator metadata (esbuild, tsx).
 */
export function InjectBus(name: string = DEFAULT_BUS_NAME): PropertyDecorator & ParameterDecorator {
  return Inject(getBusToken(name));
}
