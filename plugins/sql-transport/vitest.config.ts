import { courierProject } from '../../vitest.shared.js';

export default courierProject('sql-transport', { testTimeout: 90_000 });
