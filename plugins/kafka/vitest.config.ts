import { courierProject } from '../../vitest.shared.js';

export default courierProject('kafka', { testTimeout: 90_000 });
