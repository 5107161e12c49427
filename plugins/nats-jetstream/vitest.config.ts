import { courierProject } from '../../vitest.shared.js';

// Longer than the workspace's 30 s: in a CI run loaded by a full benchmark, one transport
// case (three messages, a fixture of three file-backed streams) once took over 30 s while
// every other case took under 3 s; where the time went is not known yet (JetStream API calls
// on a disk the benchmark saturates, or a pull that close waits out), so the bound is
// generous rather than the case flaky.
export default courierProject('nats-jetstream', { testTimeout: 90_000 });
