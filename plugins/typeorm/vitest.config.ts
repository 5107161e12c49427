import { courierProject } from '../../vitest.shared.js';

export default courierProject('typeorm');
