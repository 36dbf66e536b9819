// Drives the Reporter's MQTT link (dist/mqtt.js) for tests/test_js_link.py, in Node (its
// WebSocket is the WHATWG one browsers have; Node 20 needs --experimental-websocket):
//   node link.mjs '{"url", "device", "password"?, "keepaliveS"?, "reconnectPeriodMs"?,
//                   "connectTimeoutMs"?, "phases": [{"chunks", "waitMs", "until"?}, ...]}'
//     one Reporter, in this process, stream s1 started. Each phase (after the first, once a
//     line comes on stdin) reports `chunks` chunks of 80 ms, each in a message of its own
//     (flushMs 0), prints {"reported": phase}, then waits up to `waitMs`: for flush(), or with
//     `until` ({"connectErrors": n}) until the stats reach it; prints {"phase", "done",
//     "stats", "logs"}.
//   node link.mjs --packets '{"clientId", "username", "password"?, "keepaliveS", "topic",
//                             "payloads": [length, ...]}'
//     prints [hex, ...]: the CONNECT, then a QoS 1 PUBLISH of each length (bytes i % 251).
import { createInterface } from "node:readline";

import { connectPacket, publishPacket } from "../dist/mqtt.js";
import { Reporter } from "../dist/index.js";

const hex = (bytes) => Buffer.from(bytes).toString("hex");
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function until(reporter, goal, waitMs) {
  const deadline = performance.now() + waitMs;
  for (;;) {
    const stats = reporter.stats;
    if (Object.entries(goal).every(([name, least]) => stats[name] >= least)) return true;
    if (performance.now() > deadline) return false;
    await sleep(20);
  }
}

if (process.argv[2] === "--packets") {
  const spec = JSON.parse(process.argv[3]);
  const topic = new TextEncoder().encode(spec.topic);
  const field = new Uint8Array(2 + topic.length);
  field.set([topic.length >> 8, topic.length & 0xff]);
  field.set(topic, 2);
  const out = [hex(connectPacket(spec))];
  spec.payloads.forEach((length, i) => {
    const payload = Uint8Array.from({ length }, (_, at) => at % 251);
    out.push(hex(publishPacket(field, i + 1, payload)));
  });
  console.log(JSON.stringify(out));
} else {
  const spec = JSON.parse(process.argv[2]);
  const logs = [];
  const options = { device: spec.device, flushMs: 0, worker: false, log: (m) => logs.push(m) };
  for (const name of ["password", "keepaliveS", "reconnectPeriodMs", "connectTimeoutMs"]) {
    if (spec[name] !== undefined) options[name] = spec[name];
  }
  const reporter = new Reporter(spec.url, options);
  const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  reporter.start("s1", {});
  for (const [phase, { chunks, waitMs, until: goal }] of spec.phases.entries()) {
    if (phase > 0) await lines.next();
    for (let i = 0; i < chunks; i += 1) {
      reporter.chunk("s1", { audioMs: 80 });
      await sleep(1);
    }
    console.log(JSON.stringify({ reported: phase }));
    const done = goal === undefined ? await reporter.flush(waitMs) : await until(reporter, goal, waitMs);
    console.log(JSON.stringify({ phase, done, stats: reporter.stats, logs }));
  }
  await reporter.close(1000);
  process.exit(0);
}
