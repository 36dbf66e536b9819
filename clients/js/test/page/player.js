// The test player: plays what /plan.json says, the way web players play streamed TTS, and
// reports it with edgemon-reporter. Sets `window.__result` when done (drive.mjs waits for it).
//
// Streams come from the test's server as frames: u32 length (little endian), u8 final, then
// that many bytes (PCM s16le for "webaudio", MP3 for "mse"). A "webaudio" stream is played by
// scheduling each decoded chunk as an AudioBufferSourceNode (WebAudioStream); an "mse" one by
// appending it to a SourceBuffer of an <audio> element (MediaElementStream).
import { MediaElementStream, Reporter, WebAudioStream } from "/edgemon-reporter.min.js";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Messages the page posted to its workers (with the plan's `countPosts`: `countPosts()`
// wraps `Worker.prototype.postMessage`). A player reads it around each hook call: what the
// call posted before it returned, in the caller's task.
let posts = 0;
function countPosts() {
  const post = Worker.prototype.postMessage;
  Worker.prototype.postMessage = function (...args) {
    posts += 1;
    return post.apply(this, args);
  };
}

async function* frames(response) {
  const reader = response.body.getReader();
  let pending = new Uint8Array(0);
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    const joined = new Uint8Array(pending.length + value.length);
    joined.set(pending);
    joined.set(value, pending.length);
    pending = joined;
    while (pending.length >= 5) {
      const view = new DataView(pending.buffer, pending.byteOffset, pending.length);
      const size = view.getUint32(0, true);
      if (pending.length < 5 + size) break;
      yield { final: pending[4] === 1, data: pending.slice(5, 5 + size), size };
      pending = pending.slice(5 + size);
    }
  }
}

function pcmBuffer(context, data, rate) {
  const samples = new Int16Array(data.buffer, data.byteOffset, data.length >> 1);
  const buffer = context.createBuffer(1, samples.length, rate);
  const channel = buffer.getChannelData(0);
  for (let i = 0; i < samples.length; i += 1) channel[i] = samples[i] / 32768;
  return buffer;
}

function reporterFor(plan, spec) {
  const options = {
    device: spec.device, password: spec.password, flushMs: plan.flushMs ?? 5,
    mergeMs: plan.mergeMs ?? plan.flushMs ?? 5, handoffMs: plan.handoffMs ?? 0,
  };
  if (spec.workerUrl) options.workerUrl = spec.workerUrl;
  if (spec.mergeChunks === false) options.mergeChunks = false;
  if (plan.worker === false) options.worker = false;
  if (plan.sharedMemory === false) options.sharedMemory = false;
  return new Reporter(spec.broker ?? plan.broker, options);
}

async function playWebAudio(plan, spec) {
  const reporter = reporterFor(plan, spec);
  await reporter.waitConnected(spec.connectWaitMs ?? 20_000);
  const context = new AudioContext();
  await context.resume();
  const hook = new WebAudioStream(reporter, context, spec.stream);
  const arrivals = [];
  const posted = [];
  hook.request();
  const response = await fetch(spec.path, { cache: "no-store" });
  let index = 0;
  for await (const frame of frames(response)) {
    const buffer = pcmBuffer(context, frame.data, spec.rate);
    const before = posts;
    hook.play(buffer, { final: frame.final });
    posted.push(posts - before);
    arrivals.push(reporter.clockMs());
    if (spec.pauseAfter === index) {
      await hook.pause();
      setTimeout(() => hook.resume(), spec.pauseMs);
    }
    index += 1;
  }
  // Let the audio play out before reading what the browser measured.
  while (context.state !== "running") await sleep(20);
  const flushed = await reporter.flush(spec.flushWaitMs ?? 10_000);
  const result = {
    stream: spec.stream, device: spec.device, arrivals, posted, hook: hook.stats, flushed, reporter: reporter.stats,
  };
  await reporter.close();
  await context.close();
  return result;
}

async function playMse(plan, spec) {
  const reporter = reporterFor(plan, spec);
  await reporter.waitConnected(20_000);
  const element = document.getElementById("mse");
  const source = new MediaSource();
  element.src = URL.createObjectURL(source);
  await new Promise((resolve) => source.addEventListener("sourceopen", resolve, { once: true }));
  const buffer = source.addSourceBuffer("audio/mpeg");
  const hook = new MediaElementStream(reporter, element, spec.stream);
  hook.request();
  const response = await fetch(spec.path, { cache: "no-store" });
  let playing = null;
  const posted = [];
  for await (const frame of frames(response)) {
    buffer.appendBuffer(frame.data);
    await new Promise((resolve) => buffer.addEventListener("updateend", resolve, { once: true }));
    const before = posts;
    hook.chunk(spec.chunkMs, { final: frame.final });
    posted.push(posts - before);
    if (playing === null) playing = element.play();
  }
  source.endOfStream();
  await playing;
  await new Promise((resolve) => {
    if (element.ended) resolve();
    else element.addEventListener("ended", resolve, { once: true });
  });
  const flushed = await reporter.flush(10_000);
  const result = { stream: spec.stream, device: spec.device, posted, hook: hook.stats, flushed, reporter: reporter.stats };
  await reporter.close();
  return result;
}

// Load: `streams` streams of one `chunkMs` chunk every `chunkMs` (staggered evenly), on one
// device and one AudioContext, for `seconds` a phase: a "report" phase plays them through
// `WebAudioStream` and the Reporter, a "baseline" phase schedules the same chunks itself.
// With `floor`, a "floor" phase between them schedules them as the baseline does and posts
// one number a chunk to a worker that does nothing with it: the least a page pays to hand
// each chunk to a worker as it comes. One unmeasured round of every phase first (the page's
// code compiled, the workers started and connected), then `pairs` rounds, each phase marked
// where it starts and ends (`window.phase`: drive.mjs takes Chrome's metrics there).
async function playLoad(context, spec, reporter, serial, floor = null) {
  const rate = 24_000;
  const frames = (rate * spec.chunkMs) / 1000;
  const streams = [];
  for (let i = 0; i < spec.streams; i += 1) {
    const hook = reporter ? new WebAudioStream(reporter, context, `${spec.stream}-${serial}-${i}`) : null;
    if (hook) hook.request();
    streams.push({ hook, next: 0 });
  }
  const chunks = Math.round((spec.seconds * 1000) / spec.chunkMs);
  let sent = 0;
  await new Promise((resolve) => {
    streams.forEach((stream, i) => setTimeout(() => {
      let count = 0;
      const tick = () => {
        const buffer = context.createBuffer(1, frames, rate);
        const final = count === chunks - 1;
        if (stream.hook) {
          stream.hook.play(buffer, { final });
        } else {
          const node = context.createBufferSource();
          node.buffer = buffer;
          node.connect(context.destination);
          const at = Math.max(stream.next, context.currentTime);
          node.start(at);
          stream.next = at + buffer.duration;
          if (floor) floor.postMessage(performance.timeOrigin + performance.now());
        }
        count += 1;
        sent += 1;
        if (final) {
          clearInterval(stream.interval);
          if (sent === chunks * streams.length) resolve();
        }
      };
      stream.interval = setInterval(tick, spec.chunkMs);
    }, (i * spec.chunkMs) / streams.length));
  });
  return sent;
}

async function load(plan, spec) {
  const context = new AudioContext();
  await context.resume();
  const reporter = reporterFor(plan, spec);
  const connected = await reporter.waitConnected(20_000);
  const floor = spec.floor
    ? new Worker(URL.createObjectURL(new Blob(["onmessage = () => {};"], { type: "text/javascript" })))
    : null;
  const phases = floor ? ["baseline", "floor", "report"] : ["baseline", "report"];
  let serial = 0;
  const play = (phase, timing) => playLoad(
    context, timing, phase === "report" ? reporter : null, serial++, phase === "floor" ? floor : null,
  );
  const warm = { ...spec, seconds: spec.warmupS ?? 2 };
  for (const phase of phases) await play(phase, warm);
  const flushed = [await reporter.flush(10_000)];
  const chunks = Object.fromEntries(phases.map((phase) => [phase, 0]));
  for (let pair = 0; pair < (spec.pairs ?? 1); pair += 1) {
    for (const phase of phases) {
      await window.phase?.(`${phase}-${pair}-start`);
      chunks[phase] += await play(phase, spec);
      await window.phase?.(`${phase}-${pair}-end`);
      // Settled between phases, so that no phase pays for the one before it.
      if (phase === "report") flushed.push(await reporter.flush(10_000));
    }
  }
  const stats = reporter.stats;
  floor?.terminate();
  await reporter.close();
  await context.close();
  return { connected, flushed, chunks, reporter: stats };
}

async function main() {
  const plan = await (await fetch("/plan.json", { cache: "no-store" })).json();
  if (plan.countPosts) countPosts();
  const results = { streams: [], load: null };
  if (plan.load) results.load = await load(plan, plan.load);
  const players = (plan.streams ?? []).map((spec) => (spec.kind === "mse" ? playMse(plan, spec) : playWebAudio(plan, spec)));
  results.streams = await Promise.all(players);
  return results;
}

main().then(
  (result) => { window.__result = result; },
  (error) => { window.__result = { error: `${error?.stack ?? error}` }; },
);
