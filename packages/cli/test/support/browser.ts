// The machine's Chromium (Debian's `chromium` package) driven by playwright-core: no browser
// download. A missing browser fails the run loudly with how to install it.
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium, type Browser } from 'playwright-core';
import { PACKAGE_DIR } from './run-cli.js';

export const CHROMIUM = process.env['COURIER_CHROMIUM'] ?? '/usr/bin/chromium';
/** Screenshots the browser tests save (gitignored): CI keeps them as artifacts. */
export const ARTIFACTS = join(PACKAGE_DIR, 'artifacts', 'console');

export async function launchChromium(): Promise<Browser> {
  if (!existsSync(CHROMIUM)) {
    throw new Error(`no Chromium at ${CHROMIUM}: install Debian's package (\`apt-get install -y chromium\`; scripts/services.sh does it) or point COURIER_CHROMIUM at one`);
  }
  mkdirSync(ARTIFACTS, { recursive: true });
  return chromium.launch({
    executablePath: CHROMIUM,
    // Without these Chromium keeps trying hosts it cannot reach from here; playwright gives
    // every launch a fresh profile of its own.
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
    ],
  });
}
