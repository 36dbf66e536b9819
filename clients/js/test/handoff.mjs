// Checks the shared-memory hand-off (dist/handoff.js) against the calls themselves, for
// tests/test_js_handoff.py: node handoff.mjs SEED TRIALS
// Each trial hands a random sequence of calls (starts, chunks and ends of a few streams; plain
// and odd fields, audio formats, final or not) to a RingWriter. The messages it returns wait
// in a queue the "worker" reads at random moments, as it reads the ring: a message reaches the
// worker after every slot written before it, and may come much later; a worker that reads
// rarely lets the ring fill. 2 % of the messages are refused, as a call the structured clone
// cannot copy: the worker must skip it, and apply the stream's later calls all the same. The
// calls the RingReader applies must be the calls made (less those refused), in their order.
// Prints {"trials", "calls", "onRing", "byMessage", "filled" (trials whose ring was full),
// "wrong": [first few differences]}.
import { isDeepStrictEqual } from "node:util";

import { RingReader, RingWriter } from "../dist/handoff.js";
import { chunkCall, endCall, startCall } from "../dist/calls.js";

let state = Number(process.argv[2] ?? 1) >>> 0;
const random = () => {
  state = (state * 1664525 + 1013904223) >>> 0;
  return state / 2 ** 32;
};
const pick = (items) => items[Math.floor(random() * items.length)];
const field = () => pick([undefined, undefined, 80, 0.1, 1e-5, -0, NaN, Infinity, "80", null, 3]);

function makeCall(t) {
  const stream = pick(["s1", "s2", "s3", "s4", 7]);
  const kind = random();
  if (kind < 0.08) return startCall(stream, t, { playStartMs: field(), marginMs: field() });
  if (kind < 0.14) return endCall(stream, t, pick(["completed", "cancelled"]));
  return chunkCall(stream, t, t - 1e12, {
    audioMs: field(), pcmBytes: random() < 0.2 ? field() : undefined,
    audioFormat: random() < 0.05 ? "s16le:24000:1" : undefined, etaMs: field(),
    final: pick([undefined, undefined, undefined, true, false, 1]),
    playStartMs: random() < 0.1 ? field() : undefined,
  });
}

const trials = Number(process.argv[3] ?? 200);
let calls = 0;
let byMessage = 0;
const filled = new Set();
const wrong = [];
for (let trial = 0; trial < trials; trial += 1) {
  const writer = new RingWriter();
  const applied = [];
  const reader = new RingReader(writer.buffer, (call) => applied.push(call));
  const made = [];
  const queue = [];
  const lag = pick([0.02, 0.5, 0.98, 1]); // how rarely the worker reads (1: the ring fills)
  const count = Math.floor(random() * (lag === 1 ? 8000 : 3000));
  const control = new Int32Array(writer.buffer, 0, 2); // slots written, slots read
  for (let i = 0; i < count; i += 1) {
    const call = makeCall(1.7e12 + i);
    made.push(call);
    const message = writer.hand(call);
    if (message !== null && random() < 0.02) {
      queue.push(writer.refused(message)); // as if the call could not be cloned: skipped
      made.pop();
    } else if (message !== null) {
      queue.push(structuredClone(message));
      byMessage += 1;
    }
    if (control[0] - control[1] === 1024) filled.add(trial);
    if (random() > lag) reader.drain();
    while (queue.length && random() > lag) reader.message(queue.shift());
  }
  while (queue.length) reader.message(queue.shift());
  reader.drain();
  calls += count;
  if (!isDeepStrictEqual(applied, made) && wrong.length < 3) {
    const at = applied.findIndex((call, i) => !isDeepStrictEqual(call, made[i]));
    wrong.push({ trial, at, applied: applied.length, made: made.length, got: String(applied[at]), want: String(made[at]) });
  }
}
console.log(JSON.stringify({ trials, calls, onRing: calls - byMessage, byMessage, filled: filled.size, wrong }));
