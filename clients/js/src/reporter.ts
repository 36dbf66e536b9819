/**
 * `Reporter`: a web player tells edgemon when each audio chunk reached it (docs/protocol.md),
 * the browser counterpart of the Python `edgemon.client.Reporter`: the same topics, payloads,
 * batching, sequence numbers and clock rules, over MQTT on a WebSocket (mqtt.ts, its own client), QoS 1.
 *
 * - **Clock.** `t_ms` is `performance.timeOrigin + performance.now()`: the page's monotonic
 *   clock from a fixed origin (about Unix epoch milliseconds), never `Date.now()`, which
 *   jumps when the system clock is set.
 * - **Off the main thread.** A call (`start`, `chunk`, `end`) reads the clocks, copies its
 *   arguments and posts them to the Reporter's Web Worker (worker.ts), which builds and checks
 *   the events, batches them and publishes them (core.ts, mqtt.ts and the WebSocket): the
 *   page's main thread pays one `postMessage` a call, or, on a cross-origin isolated page, a
 *   slot of shared memory a chunk (handoff.ts). Where no worker can start (a Content
 *   Security Policy, a bundle served from another origin, `worker: false`, Node), the same
 *   core runs in the page; a worker that failed to start is counted
 *   (`stats.workerFailures`) and logged once. Calls made before either is ready wait here
 *   (at most `maxBufferedEvents`), and go to the one that starts.
 * - **Never throws.** Only the constructor throws, on a bad option. A bad argument is counted
 *   (`stats.invalid`), a call the stream's state makes moot too (`stats.conflicts`), each kind
 *   logged once; a broker that is down costs a counter (`stats.connectErrors`) and a bounded
 *   buffer (the oldest chunk dropped first, `stats.dropped`; later chunks carry
 *   `audio_total_ms`, so edgemon resynchronises).
 * - **Batching.** What was reported within `flushMs` of the oldest waiting event goes out as
 *   one JSON array on `P/{device}/events` (QoS 1), split to stay within edgemon's default
 *   `max_batch_events` and `max_payload_bytes`; chunks of one stream reported within
 *   `mergeMs` of its first piece become one event (audio summed, `t_ms` the last piece's).
 * - **Stats** are the core's as last heard from the worker (reading them asks it for fresh
 *   ones; they are exact once `flush()` has resolved), plus what the page's side counted.
 */

import { type Call, chunkCall, endCall, startCall } from "./calls.js";
import type { CoreSettings, CoreStats, ReporterCore } from "./core.js";
import { type ChunkOptions, parseFormat, type StartOptions } from "./events.js";
import { canShare, RingWriter } from "./handoff.js";
import { loadCore, startWorker } from "./load.js";
import { EMPTY, PageSink, type Reply, type Sink, WorkerSink } from "./sinks.js";
import {
  MAX_BATCH_EVENTS, MAX_PAYLOAD_BYTES, MAX_STREAMS_PER_DEVICE, TOPIC_PREFIX, topicPrefixProblem,
  validDeviceId,
} from "./protocol.js";

export interface ReporterOptions {
  /** The device id: the topic level, and the MQTT username unless `username` is given. */
  device: string;
  username?: string;
  /** The device's password, or a token the page's server handed out (docs: how-to/web-player). */
  password?: string;
  /** Coalescing window (ms): what is reported within it of the oldest waiting event goes out
   * as one message. */
  flushMs?: number;
  /** Pieces of one stream's chunk reported within this window (ms) of its first piece are one
   * chunk event (default `flushMs`, as the Python client: its flush window is both). */
  mergeMs?: number;
  topicPrefix?: string;
  /** MQTT client id (default: `reporter-<device>-<random>`, a clean session). */
  clientId?: string;
  /** The format of `pcmBytes` when neither `start()` nor the chunk names one. */
  audioFormat?: string;
  maxBufferedEvents?: number;
  maxBatchEvents?: number;
  maxPayloadBytes?: number;
  maxInFlight?: number;
  maxStreams?: number;
  mergeChunks?: boolean;
  /** The event clock, in ms (default `performance.timeOrigin + performance.now()`). */
  clock?: () => number;
  /** The monotonic clock of merge windows, in ms (default `performance.now()`). */
  monotonic?: () => number;
  /** Between reconnection attempts (ms). */
  reconnectPeriodMs?: number;
  connectTimeoutMs?: number;
  keepaliveS?: number;
  /** Where the first warning of each kind goes (default `console.warn`). */
  log?: (message: string) => void;
  /** How long the page holds calls before it posts them to the worker together (ms; default
   * 0: each call is posted as it is made). What a call costs the page's main thread is mostly
   * its message waking the worker: a window costs a timer of the page's and one message for
   * all the calls within it, less only when more than one falls in it, and delays every event
   * by up to that much more than `flushMs`. */
  handoffMs?: number;
  /** Report from a Web Worker (default true where the page has `Worker`); false: in the page. */
  worker?: boolean;
  /** The worker's module (default: the package's own, next to it; give a same-origin copy
   * when the package is served from another origin). */
  workerUrl?: string | URL;
  /** Hand the calls to the worker through shared memory where the page is cross-origin
   * isolated (default true; handoff.ts): the page's main thread then posts a message only for
   * a stream's first call, its start and end, and to wake a worker that slept. */
  sharedMemory?: boolean;
}

export interface ReporterStats extends CoreStats {
  /** Whether the calls go to the Reporter's Web Worker (false: reported from the page). */
  worker: boolean;
  /** Workers that failed to start (the Reporter then reports from the page). */
  workerFailures: number;
  /** Whether the calls reach the worker through shared memory (else by `postMessage`). */
  sharedMemory: boolean;
}

/** How long a worker may take to load before the page reports without it (ms). */
const WORKER_START_MS = 10_000;

function bound(name: string, value: number, low: number, high = Number.MAX_SAFE_INTEGER): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value < low || value > high) {
    throw new TypeError(`edgemon-reporter: ${name} must be ${low} ≤ x ≤ ${high}, not ${String(value)}`);
  }
  return value;
}

function integer(name: string, value: number, low: number): number {
  if (!Number.isInteger(value) || value < low) {
    throw new TypeError(`edgemon-reporter: ${name} must be an integer ≥ ${low}, not ${String(value)}`);
  }
  return value;
}

export class Reporter {
  readonly device: string;
  readonly topic: string;
  /** The Reporter's event clock (ms): what `t_ms` is read from. */
  readonly clockMs: () => number;
  private readonly url: string;
  private readonly settings: CoreSettings;
  private readonly monotonic: () => number;
  private readonly origin: number;
  private readonly pageClocks: boolean;
  private readonly log: (message: string) => void;
  private readonly useWorker: boolean;
  private readonly handoffMs: number;
  private readonly workerUrl: string | URL | undefined;
  private readonly sharedMemory: boolean;
  private sink: Sink | null = null;
  /** Calls made before a core was ready, oldest first. */
  private held: Call[] = [];
  private opened = false;
  private unavailable = false; // no core could be loaded: calls are dropped and counted
  private closing: Promise<void> | null = null;
  private closed = false;
  private finalStats: CoreStats | null = null;
  private starting: Worker | null = null;
  private startTimer: ReturnType<typeof setTimeout> | undefined;
  private readonly chosen: Promise<void>;
  private choose: () => void = () => {};
  private connected = false;
  private readonly connectWaiters = new Set<() => void>();
  // What the page's side counted itself.
  private dropped = 0;
  private invalid = 0;
  private errors = 0;
  private workerFailures = 0;
  private readonly conflicts: Record<string, number> = {};
  private readonly said = new Set<string>();

  constructor(url: string, options: ReporterOptions) {
    if (!validDeviceId(options.device)) {
      throw new TypeError(`edgemon-reporter: device ${String(options.device)} must match [A-Za-z0-9._-]{1,64} and not be _edgemon`);
    }
    const prefix = options.topicPrefix ?? TOPIC_PREFIX;
    const problem = topicPrefixProblem(prefix);
    if (problem !== null) throw new TypeError(`edgemon-reporter: topic prefix ${prefix} ${problem}`);
    if (options.audioFormat !== undefined) {
      try {
        parseFormat(options.audioFormat);
      } catch (error) {
        throw new TypeError(`edgemon-reporter: ${(error as Error).message}`);
      }
    }
    this.url = url;
    this.device = options.device;
    this.topic = `${prefix}/${options.device}/events`;
    const origin = performance.timeOrigin;
    this.origin = origin;
    this.pageClocks = options.clock === undefined && options.monotonic === undefined;
    this.clockMs = options.clock ?? (() => origin + performance.now());
    this.monotonic = options.monotonic ?? (() => performance.now());
    this.log = options.log ?? ((message) => console.warn(message));
    this.useWorker = options.worker ?? true;
    this.workerUrl = options.workerUrl;
    this.sharedMemory = options.sharedMemory ?? true;
    const flushMs = bound("flushMs", options.flushMs ?? 5, 0, 60_000);
    this.handoffMs = bound("handoffMs", options.handoffMs ?? 0, 0, 60_000);
    const random = Math.random().toString(16).slice(2, 10);
    this.settings = {
      device: options.device,
      topic: this.topic,
      clientId: options.clientId ?? `reporter-${options.device}-${random}`,
      username: options.username ?? options.device,
      flushMs,
      mergeMs: bound("mergeMs", options.mergeMs ?? flushMs, 0, 60_000),
      mergeChunks: options.mergeChunks ?? true,
      maxBufferedEvents: integer("maxBufferedEvents", options.maxBufferedEvents ?? 10_000, 1),
      maxBatchEvents: integer("maxBatchEvents", options.maxBatchEvents ?? MAX_BATCH_EVENTS, 1),
      maxPayloadBytes: integer("maxPayloadBytes", options.maxPayloadBytes ?? MAX_PAYLOAD_BYTES, 1024),
      maxInFlight: integer("maxInFlight", options.maxInFlight ?? 16, 1),
      maxStreams: integer("maxStreams", options.maxStreams ?? MAX_STREAMS_PER_DEVICE, 1),
      reconnectPeriodMs: options.reconnectPeriodMs ?? 1000,
      connectTimeoutMs: options.connectTimeoutMs ?? 10_000,
      keepaliveS: options.keepaliveS ?? 30,
    };
    if (options.password !== undefined) this.settings.password = options.password;
    if (options.audioFormat !== undefined) this.settings.audioFormat = options.audioFormat;
    this.chosen = new Promise((resolve) => {
      this.choose = resolve;
    });
  }

  // ---------------------------------------------------------------- lifecycle
  /** Connect in the background (never waits, never throws); idempotent. The first call
   * opens a Reporter that was not opened. */
  open(): this {
    if (this.opened || this.closing !== null) return this;
    this.opened = true;
    try {
      if (this.useWorker && typeof Worker === "function") this.startWorker();
      else this.startInPage();
    } catch (error) {
      this.failed(error);
    }
    return this;
  }

  /** Resolves true once connected, false after `timeoutMs`. */
  waitConnected(timeoutMs: number): Promise<boolean> {
    this.open();
    if (this.connected) return Promise.resolve(true);
    if (this.unavailable) return Promise.resolve(false);
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        this.connectWaiters.delete(done);
        resolve(this.connected);
      };
      const timer = setTimeout(done, timeoutMs);
      this.connectWaiters.add(done);
    });
  }

  /** Resolves true once every event reported before the call is acknowledged by the broker
   * (or was dropped), false after `timeoutMs`. */
  async flush(timeoutMs = 5000): Promise<boolean> {
    if (!this.opened) return true; // nothing was reported
    if (this.closed) {
      const last = this.finalStats ?? EMPTY;
      return this.held.length === 0 && last.buffered === 0 && last.inFlight === 0;
    }
    const started = performance.now();
    if (!(await this.ready(timeoutMs))) return false;
    const sink = this.sink;
    if (sink === null) return false;
    return sink.flush(Math.max(0, timeoutMs - (performance.now() - started)));
  }

  /** Flush (for up to `timeoutMs`), then disconnect; idempotent. */
  close(timeoutMs = 5000): Promise<void> {
    if (this.closing === null) this.closing = this.shut(timeoutMs);
    return this.closing;
  }

  get stats(): ReporterStats {
    const sink = this.sink;
    const core = this.finalStats ?? sink?.stats() ?? EMPTY;
    const conflicts: Record<string, number> = { ...core.conflicts };
    for (const [kind, count] of Object.entries(this.conflicts)) conflicts[kind] = (conflicts[kind] ?? 0) + count;
    return {
      ...core,
      dropped: core.dropped + this.dropped,
      buffered: core.buffered + this.held.length,
      connected: this.closed ? false : core.connected,
      conflicts,
      invalid: core.invalid + this.invalid,
      errors: core.errors + this.errors,
      worker: sink !== null && sink.worker,
      workerFailures: this.workerFailures,
      sharedMemory: sink instanceof WorkerSink && sink.shared,
    };
  }

  // ---------------------------------------------------------------- the calls
  /** A stream begins: call it at the request, so that start silence counts. */
  start(stream: string, options: StartOptions = {}): void {
    try {
      this.deliver(startCall(stream, this.clockMs(), options));
    } catch (error) {
      this.failed(error);
    }
  }

  /** A chunk of audio reached the player now (`audioMs`, or `pcmBytes` of the stream's format). */
  chunk(stream: string, options: ChunkOptions): void {
    try {
      this.deliver(chunkCall(stream, this.clockMs(), this.monotonic(), options));
    } catch (error) {
      this.failed(error);
    }
  }

  /** `chunk()` at `tMs`, a reading of `clockMs()` just taken (the hooks read the clock once
   * for the play start and the chunk). @internal */
  chunkAt(stream: string, tMs: number, options: ChunkOptions): void {
    try {
      // With the page's clocks, the merge window's clock is the same reading.
      const now = this.pageClocks ? tMs - this.origin : this.monotonic();
      this.deliver(chunkCall(stream, tMs, now, options));
    } catch (error) {
      this.failed(error);
    }
  }

  /** The stream ended (`completed`, `cancelled`, `error`, …); nothing is needed after a final chunk. */
  end(stream: string, reason = "completed"): void {
    try {
      this.deliver(endCall(stream, this.clockMs(), reason));
    } catch (error) {
      this.failed(error);
    }
  }

  /** Count a failure of a hook (never thrown into the page). */
  noteError(error: unknown): void {
    this.errors += 1;
    this.once("hook", `edgemon reporter ${this.device}: ${String(error)} (counted in stats.errors)`);
  }

  // ---------------------------------------------------------------- inside
  private deliver(call: Call): void {
    if (this.closed) {
      this.conflict("closed", "this Reporter is closed: nothing more is sent");
      return;
    }
    if (this.sink === null) this.open();
    const sink = this.sink;
    if (sink !== null) {
      sink.call(call);
    } else if (this.unavailable) {
      this.dropped += 1;
    } else {
      this.hold(call);
    }
  }

  /** Keep `call` until a core is ready (the bound kept: the oldest chunk goes first). */
  private hold(call: Call): void {
    const held = this.held;
    if (held.length >= this.settings.maxBufferedEvents) {
      const chunk = held.findIndex((c) => c[0] === 1);
      held.splice(chunk < 0 ? 0 : chunk, 1);
      this.dropped += 1;
    }
    held.push(call);
  }

  private startWorker(): void {
    let worker: Worker;
    try {
      worker = startWorker(this.workerUrl);
    } catch (error) {
      this.workerFailed(null, error);
      return;
    }
    this.starting = worker;
    worker.onmessage = (event: MessageEvent) => this.fromWorker(worker, event.data as Reply);
    worker.onerror = (event: ErrorEvent) => {
      event.preventDefault();
      if (this.sink === null) this.workerFailed(worker, event.message || "the worker's script failed to load");
      else this.noteError(`the worker: ${event.message}`);
    };
    worker.onmessageerror = () => this.noteError("a message from the worker could not be read");
    this.startTimer = setTimeout(() => {
      this.workerFailed(worker, `it did not load within ${WORKER_START_MS} ms`);
    }, WORKER_START_MS);
  }

  private fromWorker(worker: Worker, message: Reply): void {
    try {
      const sink = this.sink;
      if (message[0] === "ready") {
        if (this.starting !== worker || sink !== null) return;
        clearTimeout(this.startTimer);
        this.starting = null;
        const ring = this.sharedMemory && this.handoffMs === 0 && canShare() ? new RingWriter() : null;
        const made = new WorkerSink(worker, this.handoffMs, (error) => this.failed(error), ring);
        made.post(["init", this.url, this.settings, ring?.buffer ?? null]);
        made.deliverHeld(this.held);
        this.held = [];
        made.open();
        this.sink = made;
        this.choose();
      } else if (message[0] === "log") {
        this.say(String(message[1]));
      } else if (sink instanceof WorkerSink) {
        sink.received(message);
        if (message[0] === "state") this.stateChanged(sink.latest);
      }
    } catch (error) {
      this.noteError(error);
    }
  }

  private workerFailed(worker: Worker | null, error: unknown): void {
    if (this.sink !== null || (worker !== null && this.starting !== worker)) return;
    clearTimeout(this.startTimer);
    this.starting = null;
    try {
      worker?.terminate();
    } catch {
      // gone already
    }
    this.workerFailures += 1;
    const reason = error instanceof Error ? error.message : String(error);
    this.once("worker", `edgemon reporter ${this.device}: its worker did not start (${reason}); reporting from the page (counted in stats.workerFailures)`);
    this.startInPage();
  }

  private startInPage(): void {
    loadCore().then(
      (module) => {
        if (this.sink !== null) return;
        const core: ReporterCore = new module.ReporterCore(
          this.url, this.settings, this.monotonic, (message) => this.say(message),
          () => this.stateChanged(core.stats),
        );
        const sink = new PageSink(core);
        for (const call of this.held) sink.call(call);
        this.held = [];
        sink.open();
        this.sink = sink;
        this.choose();
      },
      (error: unknown) => {
        this.unavailable = true;
        this.errors += 1;
        this.dropped += this.held.length;
        this.held = [];
        this.once("load", `edgemon reporter ${this.device}: could not load its core (${String(error)}); nothing is reported (counted in stats.errors, calls in stats.dropped)`);
        this.choose();
      },
    );
  }

  /** Resolves whether a core is ready, waiting at most `timeoutMs`. */
  private ready(timeoutMs: number): Promise<boolean> {
    if (this.sink !== null) return Promise.resolve(true);
    if (this.unavailable) return Promise.resolve(false);
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(this.sink !== null), timeoutMs);
      void this.chosen.then(() => {
        clearTimeout(timer);
        resolve(this.sink !== null);
      });
    });
  }

  private async shut(timeoutMs: number): Promise<void> {
    if (this.opened) {
      const started = performance.now();
      await this.ready(timeoutMs);
      const sink = this.sink;
      if (sink !== null) {
        try {
          await sink.close(Math.max(0, timeoutMs - (performance.now() - started)));
        } catch (error) {
          this.noteError(error);
        }
        this.finalStats = sink.stats();
      }
    }
    this.closed = true;
    clearTimeout(this.startTimer);
    if (this.starting !== null) {
      this.starting.terminate();
      this.starting = null;
    }
    for (const waiter of [...this.connectWaiters]) waiter();
  }

  private stateChanged(stats: CoreStats): void {
    this.connected = stats.connected;
    if (this.connected) for (const waiter of [...this.connectWaiters]) waiter();
  }

  private failed(error: unknown): void {
    if (error instanceof DOMException && error.name === "DataCloneError") {
      this.invalid += 1;
      this.once("invalid", `edgemon reporter ${this.device}: an argument cannot be reported (${error.message}) (ignored; counted in stats.invalid, not logged again)`);
    } else {
      this.errors += 1;
      this.once("error", `edgemon reporter ${this.device}: ${String(error)} (counted in stats.errors)`);
    }
  }

  private conflict(kind: string, message: string): void {
    const seen = this.conflicts[kind] ?? 0;
    this.conflicts[kind] = seen + 1;
    if (seen === 0) {
      this.say(`edgemon reporter ${this.device}: ${message} (ignored; counted in stats.conflicts.${kind}, not logged again)`);
    }
  }

  private once(kind: string, message: string): void {
    if (this.said.has(kind)) return;
    this.said.add(kind);
    this.say(message);
  }

  private say(message: string): void {
    try {
      this.log(message);
    } catch {
      // the page's log failed: nothing more to do
    }
  }
}
