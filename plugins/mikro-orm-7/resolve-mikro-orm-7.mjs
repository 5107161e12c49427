// Loaded with `node --import` (NODE_OPTIONS, set by vitest.mikro-orm-7.config.ts) into every
// test worker and every process a test starts: `@mikro-orm/*` imported or required from
// outside node_modules (the plugin's sources and tests) resolves to the MikroORM 7 packages
// of this folder instead of the 6.x ones `plugins/mikro-orm` installs. Inside node_modules
// MikroORM 7's own imports already resolve to 7 (its peer dependencies are resolved against
// this package). A synchronous hook (module.registerHooks, Node 22.15+) also covers the
// plugin's lazy `createRequire(import.meta.url)('@mikro-orm/core')`, which vite never sees.
import { registerHooks } from 'node:module';

const anchor = new URL('./package.json', import.meta.url).href;

registerHooks({
  resolve(specifier, context, nextResolve) {
    if (specifier.startsWith('@mikro-orm/') && !(context.parentURL ?? '').includes('/node_modules/')) {
      return nextResolve(specifier, { ...context, parentURL: anchor });
    }
    return nextResolve(specifier, context);
  },
});
