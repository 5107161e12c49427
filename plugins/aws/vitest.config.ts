import { courierProject } from '../../vitest.shared.js';

export default courierProject('aws', { testTimeout: 90_000 });
