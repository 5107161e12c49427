import { courierProject } from '../../vitest.shared.js';

// Every CLI test runs the binary as child processes, several seconds each on a loaded machine.
export default courierProject('cli', { testTimeout: 600_000 });
