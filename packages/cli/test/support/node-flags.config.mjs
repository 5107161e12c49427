// A config that only reports how its process was started (node's own arguments, its pid),
// then fails: for the test of the flags `courier relay` gives itself.
process.stdout.write(`${JSON.stringify({ probe: 'node-flags', pid: process.pid, execArgv: process.execArgv })}\n`);
export default () => {
  throw new Error('node-flags probe: no relay here');
};
