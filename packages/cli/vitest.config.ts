import { courierProject } from '../../vitest.shared.js';

export default courierProject('cli', { testTimeout: 300_000 });
