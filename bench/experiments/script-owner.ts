/**
 * Which package a profiled script belongs to: `@courier/<name>` for the workspace's sources
 * or builds, the npm package for a dependency, `node:<module>` for Node's own (internal
 * modules by their first directory), the URL otherwise. Shared by the relay's CPU and heap
 * profiles so their tables group alike.
 */
export function scriptOwner(url: string): string | undefined {
  if (url === '') return undefined;
  const workspace = /\/(packages|plugins)\/([^/]+)\/(src|dist)\//.exec(url);
  if (workspace) return `@courier/${workspace[2]}`;
  const dependency = /node_modules\/(?:\.pnpm\/[^/]+\/node_modules\/)?((?:@[^/]+\/)?[^/]+)\//.exec(url);
  if (dependency) return dependency[1];
  if (url.startsWith('node:')) return `node:${url.slice(5).split('/')[0] === 'internal' ? url.slice(14).split('/')[0] : url.slice(5)}`;
  return url;
}
