'use strict';
// node-consume: records/s through the Node package with an async no-op
// onMessage, on the workload of bench_consume (embedded mock cluster, a
// 4-partition topic, 1 000 uniform keys, ~100-byte JSON orders), measured
// from the first record handled to the last (the group join excluded).
//   node bench/node/bench_consume.js [messages] [repetitions]
// BENCH_C_RATE (the C no-op consumer's rate from the same run) adds
// ratio=node/C to the result line.
const path = require('path');
const { ProsodyClient, AdminClient } = require(path.resolve(__dirname, '../../bindings/node'));

const messages = Number(process.argv[2] || 200000);
const reps = Number(process.argv[3] || 3);
// BENCH_WIDE=1: max_concurrency=1024, max_uncommitted=4096 (for profiling; make bench uses the defaults).
const wide = process.env.BENCH_WIDE ? { maxConcurrency: 1024, maxUncommitted: 4096 } : {};

const payload = (i, key) => ({
  id: `evt-${String(i).padStart(10, '0')}`, type: 'order.created',
  amount: Number(`${(i * 31) % 1000}.${String(i % 100).padStart(2, '0')}`), customer: key,
});

async function fill(topic) {
  const producer = new ProsodyClient({ mock: true, sourceSystem: 'bench-producer', probePort: null });
  const inflight = [];
  for (let i = 0; i < messages; i++) {
    const key = `key-${String(Math.floor(Math.random() * 1000)).padStart(4, '0')}`;
    inflight.push(producer.send(topic, key, payload(i, key)));
    if (inflight.length >= 5000) await Promise.all(inflight.splice(0));
  }
  await Promise.all(inflight);
}

async function consumeOnce(topic, run) {
  const c = new ProsodyClient({ mock: true, groupId: `bench-node-${process.pid}-${run}`, ...wide,
                                subscribedTopics: topic, probePort: null });
  let n = 0;
  let first = 0;
  let last = 0;
  let finished;
  const done = new Promise((r) => { finished = r; });
  const cpu0 = process.cpuUsage();
  await c.subscribe({
    onMessage: async () => {
      if (n === 0) first = process.hrtime.bigint();
      if (++n === messages) {
        last = process.hrtime.bigint();
        finished();
      }
    },
  });
  await done;
  const cpu = process.cpuUsage(cpu0);
  await c.unsubscribe();
  const secs = Number(last - first) / 1e9;
  return { rate: (messages - 1) / secs, cpuUs: (cpu.user + cpu.system) / messages };
}

(async () => {
  const topic = `bench-node-${process.pid}`;
  await new AdminClient({ mock: true }).createTopic(topic, 4);
  await fill(topic);
  if (process.env.BENCH_MARK) console.error('filled');
  const results = [];
  for (let r = 0; r < reps; r++) results.push(await consumeOnce(topic, r));
  results.sort((a, b) => a.rate - b.rate);
  const median = results[Math.floor(results.length / 2)];
  const c = Number(process.env.BENCH_C_RATE || 0);
  const ratio = c > 0 ? ` ratio=${(median.rate / c).toFixed(3)} c=${Math.round(c)}` : '';
  console.log(`bench node-consume-noop-uniform ${Math.round(median.rate)} msg/s${ratio} ` +
              `cpu_us_per_record=${median.cpuUs.toFixed(1)} runs=${results.map((x) => Math.round(x.rate)).join('/')}`);
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
