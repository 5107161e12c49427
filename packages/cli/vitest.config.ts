import { courierProject } from '../../vitest.shared.js';

export default courierProject('cli', { testTimeout: 120_000 });
