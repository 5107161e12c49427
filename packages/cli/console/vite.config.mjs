// Builds the operator console's front end into dist/console/ of @courier/cli, so the
// published package serves static files and nothing is built on the user's machine.
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

export default defineConfig({
  root: fileURLToPath(new URL('.', import.meta.url)),
  base: './',
  logLevel: 'warn',
  build: {
    outDir: fileURLToPath(new URL('../dist/console', import.meta.url)),
    emptyOutDir: true,
    // One small bundle: the console is a local tool, served from the machine itself.
    chunkSizeWarningLimit: 400,
    sourcemap: false,
  },
});
