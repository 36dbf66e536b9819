// Replays a trace of Reporter calls through edgemon-reporter (the package as built,
// dist/index.js, in Node: its WebSocket), in real time, for tests/test_reporter_parity.py:
//   node replay.mjs TRACE.json
// TRACE: {"broker", "device", "flush_ms", "audio_format", "calls": [{"at_ms", "t_ms", "call",
// "stream", "options"}]} with the Python client's keyword names. The Reporter's clock reads
// each call's `t_ms`; prints the Reporter's stats as JSON once everything is acknowledged.
import { readFileSync } from "node:fs";

import { Reporter } from "../dist/index.js";

const NAMES = {
  play_start_ms: "playStartMs", margin_ms: "marginMs", player: "player",
  audio_format: "audioFormat", audio_ms: "audioMs", pcm_bytes: "pcmBytes", eta_ms: "etaMs",
  final: "final",
};
const trace = JSON.parse(readFileSync(process.argv[2], "utf8"));
let now = 0;
const reporter = new Reporter(trace.broker, {
  device: trace.device, flushMs: trace.flush_ms, audioFormat: trace.audio_format,
  clock: () => now, log: () => {},
});
if (!(await reporter.waitConnected(10_000))) throw new Error("no broker");
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const t0 = performance.now();
for (const call of trace.calls) {
  const wait = t0 + call.at_ms - performance.now();
  if (wait > 0) await sleep(wait);
  now = call.t_ms;
  const options = Object.fromEntries(
    Object.entries(call.options ?? {}).filter(([key]) => key !== "reason").map(([key, value]) => [NAMES[key], value]),
  );
  if (call.call === "start") reporter.start(call.stream, options);
  else if (call.call === "chunk") reporter.chunk(call.stream, options);
  else reporter.end(call.stream, call.options?.reason);
}
const flushed = await reporter.flush(10_000);
console.log(JSON.stringify({ flushed, stats: reporter.stats }));
await reporter.close();
