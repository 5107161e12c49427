// Loaded with `node --import` (NODE_OPTIONS, set by vitest.mikro-orm-7.config.ts) into every
// test worker and every process a test starts: `@mikro-orm/*` imported or required from
// outside node_modules (the plugin's sources and tests) resolves to the MikroORM 7 packages
// of this folder instead of the 6.x ones `plugins/mikro-orm` installs. Inside node_modules
// MikroORM 7's own imports already resolve to 7 (its peer dependencies are resolved against
// this package). A synchronous hook (module.registerHooks, Node 22.15+) also covers the
// plugin's lazy `createRequire(import.meta.url)('@mikro-orm/core')`, which vite never sees.
import { createRequire, registerHooks } from 'node:module';
import { pathToFileURL } from 'node:url';

const anchor = new URL('./package.json', import.meta.url).href;
// Resolved by path, not by handing the hook chain another parentURL: Node's require()
// resolves from the requiring module's own paths whatever parentURL says. MikroORM 7's
// exports are unconditional, so one resolution serves import and require alike.
const resolveFromHere = createRequire(anchor).resolve;

registerHooks({
  resolve(specifier, context, nextResolve) {
    const parent = context.parentURL ?? '';
    if (specifier.startsWith('@mikro-orm/') && parent !== anchor && !parent.includes('/node_modules/')) {
      return { url: pathToFileURL(resolveFromHere(specifier)).href, shortCircuit: true };
    }
    return nextResolve(specifier, context);
  },
});
