import { courierProject } from '../../vitest.shared.js';

export default courierProject('nestjs', { testTimeout: 90_000 });
