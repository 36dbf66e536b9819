/**
 * `Reporter`: a web player tells edgemon when each audio chunk reached it (docs/protocol.md),
 * the browser counterpart of the Python `edgemon.client.Reporter`: the same topics, payloads,
 * batching, sequence numbers and clock rules, over MQTT on a WebSocket (mqtt.js), QoS 1.
 *
 * - **Clock.** `t_ms` is `performance.timeOrigin + performance.now()`: the page's monotonic
 *   clock from a fixed origin (about Unix epoch milliseconds), never `Date.now()`, which
 *   jumps when the system clock is set.
 * - **Calls** (`start`, `chunk`, `end`) check their arguments, stamp `t_ms` and append the
 *   event to a bounded buffer; they never wait for the network and **never throw**: a bad
 *   argument is counted (`stats.invalid`), a call the stream's state makes moot too
 *   (`stats.conflicts`), each kind logged once. Only the constructor throws, on a bad option.
 * - **Batching.** What was reported within `flushMs` of the oldest waiting event goes out as
 *   one JSON array on `P/{device}/events` (QoS 1), split to stay within edgemon's default
 *   `max_batch_events` and `max_payload_bytes`; chunks of one stream reported within one
 *   flush window become one event (audio summed, `t_ms` the last piece's arrival).
 * - **Offline.** A broker that is down or unreachable costs a counter (`stats.connectErrors`)
 *   and a bounded buffer: when it holds `maxBufferedEvents` the oldest chunk is dropped and
 *   counted (`stats.dropped`); later chunks carry `audio_total_ms`, so edgemon resynchronises.
 */

import { connect, type IClientOptions, type MqttClient } from "mqtt";

import { EventBuffer, type Indexed } from "./buffer.js";
import {
  type ChunkOptions, checkTMs, Conflict, type ConflictKind, type Event, parseFormat,
  type StartOptions, Streams,
} from "./events.js";
import { encodeEvent } from "./json.js";
import {
  InvalidArgument, MAX_BATCH_EVENTS, MAX_PAYLOAD_BYTES, MAX_STREAMS_PER_DEVICE, TOPIC_PREFIX,
  topicPrefixProblem, validDeviceId,
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
  /** The monotonic clock of flush windows, in ms (default `performance.now()`). */
  monotonic?: () => number;
  /** Between reconnection attempts (ms). */
  reconnectPeriodMs?: number;
  connectTimeoutMs?: number;
  keepaliveS?: number;
  /** Where the first warning of each kind goes (default `console.warn`). */
  log?: (message: string) => void;
}

export interface ReporterStats {
  /** Events reported (merged chunks count once). */
  events: number;
  /** Events the broker acknowledged (PUBACK), and the messages that carried them. */
  sent: number;
  messages: number;
  /** Events dropped, oldest chunk first, because the buffer was full. */
  dropped: number;
  buffered: number;
  inFlight: number;
  connected: boolean;
  connects: number;
  /** Failed connection attempts and connection errors (a broker down or refusing). */
  connectErrors: number;
  merged: number;
  /** Calls the stream's state made moot, by kind (`ended`, `unknown`, `live`, `max_streams`, `closed`). */
  conflicts: Readonly<Record<string, number>>;
  /** Calls with a bad argument (the Python client raises ValueError for these). */
  invalid: number;
  /** Anything else that went wrong inside a call (never thrown into the page). */
  errors: number;
}

interface Waiter {
  target: number;
  resolve: (done: boolean) => void;
  timer: ReturnType<typeof setTimeout> | undefined;
}

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
  private readonly url: string;
  private readonly options: ReporterOptions;
  /** The Reporter's event clock (ms): what `t_ms` is read from. */
  readonly clockMs: () => number;
  private readonly monotonic: () => number;
  private readonly log: (message: string) => void;
  private readonly streams: Streams;
  private readonly buffer: EventBuffer;
  private readonly maxInFlight: number;
  private readonly maxPayloadBytes: number;
  private client: MqttClient | null = null;
  private closed = false;
  private connected = false;
  private connects = 0;
  private connectErrors = 0;
  private unreachableSaid = false;
  private invalid = 0;
  private errors = 0;
  private readonly conflicts: Record<string, number> = {};
  private readonly said = new Set<string>();
  private readonly inFlight = new Map<number, [number, number]>(); // token -> (first, count)
  private nextToken = 0;
  private sent = 0;
  private messages = 0;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private urgent = 0;
  private waiters: Waiter[] = [];
  private readonly encoder = new TextEncoder();

  constructor(url: string, options: ReporterOptions) {
    if (!validDeviceId(options.device)) {
      throw new TypeError(`edgemon-reporter: device ${String(options.device)} must match [A-Za-z0-9._-]{1,64} and not be _edgemon`);
    }
    const prefix = options.topicPrefix ?? TOPIC_PREFIX;
    const problem = topicPrefixProblem(prefix);
    if (problem !== null) throw new TypeError(`edgemon-reporter: topic prefix ${prefix} ${problem}`);
    this.url = url;
    this.options = options;
    this.device = options.device;
    this.topic = `${prefix}/${options.device}/events`;
    const origin = performance.timeOrigin;
    this.clockMs = options.clock ?? (() => origin + performance.now());
    this.monotonic = options.monotonic ?? (() => performance.now());
    this.log = options.log ?? ((message) => console.warn(message));
    let format = null;
    try {
      format = options.audioFormat === undefined ? null : parseFormat(options.audioFormat);
    } catch (error) {
      throw new TypeError(`edgemon-reporter: ${(error as Error).message}`);
    }
    this.streams = new Streams(
      integer("maxStreams", options.maxStreams ?? MAX_STREAMS_PER_DEVICE, 1), format,
    );
    const flushMs = bound("flushMs", options.flushMs ?? 5, 0, 60_000);
    this.buffer = new EventBuffer(
      integer("maxBufferedEvents", options.maxBufferedEvents ?? 10_000, 1),
      integer("maxBatchEvents", options.maxBatchEvents ?? MAX_BATCH_EVENTS, 1),
      flushMs,
      options.mergeChunks ?? true,
      this.monotonic,
      bound("mergeMs", options.mergeMs ?? flushMs, 0, 60_000),
    );
    this.maxInFlight = integer("maxInFlight", options.maxInFlight ?? 16, 1);
    this.maxPayloadBytes = integer("maxPayloadBytes", options.maxPayloadBytes ?? MAX_PAYLOAD_BYTES, 1024);
  }

  // ---------------------------------------------------------------- lifecycle
  /** Connect in the background (never waits, never throws); idempotent. The first call
   * opens a Reporter that was not opened. */
  open(): this {
    if (this.closed || this.client !== null) return this;
    try {
      const random = Math.random().toString(16).slice(2, 10);
      const options: IClientOptions = {
        clientId: this.options.clientId ?? `reporter-${this.device}-${random}`,
        clean: true,
        protocolVersion: 4,
        username: this.options.username ?? this.device,
        reconnectPeriod: this.options.reconnectPeriodMs ?? 1000,
        connectTimeout: this.options.connectTimeoutMs ?? 10_000,
        keepalive: this.options.keepaliveS ?? 30,
        resubscribe: false,
        queueQoSZero: false,
        timerVariant: "native",
      };
      if (this.options.password !== undefined) options.password = this.options.password;
      const client = connect(this.url, options);
      client.on("connect", () => {
        this.connected = true;
        this.connects += 1;
        this.unreachableSaid = false;
        this.schedule();
      });
      client.on("close", () => {
        if (this.connected && !this.closed) this.once("lost", `edgemon reporter ${this.device}: lost the broker; buffering events until it is back`);
        this.connected = false;
      });
      client.on("offline", () => {
        this.connected = false;
      });
      client.on("error", (error: Error) => {
        this.connectErrors += 1;
        if (!this.unreachableSaid) {
          this.unreachableSaid = true;
          this.log(`edgemon reporter ${this.device}: cannot reach the broker (${error.message}); retrying, events wait in the buffer`);
        }
      });
      this.client = client;
    } catch (error) {
      this.connectErrors += 1;
      this.once("open", `edgemon reporter ${this.device}: could not connect: ${(error as Error).message}`);
    }
    return this;
  }

  /** Resolves true once connected, false after `timeoutMs`. */
  waitConnected(timeoutMs: number): Promise<boolean> {
    this.open();
    if (this.connected) return Promise.resolve(true);
    return new Promise((resolve) => {
      const client = this.client;
      if (client === null) {
        resolve(false);
        return;
      }
      const done = (): void => {
        clearTimeout(timer);
        client.removeListener("connect", done);
        resolve(this.connected);
      };
      const timer = setTimeout(done, timeoutMs);
      client.on("connect", done);
    });
  }

  /** Resolves true once every event reported before the call is acknowledged by the broker
   * (or was dropped), false after `timeoutMs`. */
  flush(timeoutMs = 5000): Promise<boolean> {
    const target = this.buffer.nextIdx;
    if (this.oldestUnsettled() >= target) return Promise.resolve(true);
    if (this.client === null) return Promise.resolve(false);
    this.urgent += 1;
    const promise = new Promise<boolean>((resolve) => {
      const waiter: Waiter = { target, resolve, timer: undefined };
      waiter.timer = setTimeout(() => this.release(waiter, false), timeoutMs);
      this.waiters.push(waiter);
    });
    this.schedule();
    return promise;
  }

  /** Flush (for up to `timeoutMs`), then disconnect; idempotent. */
  async close(timeoutMs = 5000): Promise<void> {
    if (this.closed) return;
    if (this.client !== null) await this.flush(timeoutMs);
    this.closed = true;
    clearTimeout(this.timer);
    const client = this.client;
    if (client !== null) {
      await new Promise<void>((resolve) => {
        try {
          client.end(false, {}, () => resolve());
        } catch {
          resolve();
        }
      });
    }
  }

  get stats(): ReporterStats {
    let inFlight = 0;
    for (const [, count] of this.inFlight.values()) inFlight += count;
    return {
      events: this.buffer.events, sent: this.sent, messages: this.messages,
      dropped: this.buffer.dropped, buffered: this.buffer.length, inFlight,
      connected: this.connected, connects: this.connects, connectErrors: this.connectErrors,
      merged: this.buffer.merged, conflicts: { ...this.conflicts }, invalid: this.invalid,
      errors: this.errors,
    };
  }

  // ---------------------------------------------------------------- the calls
  /** A stream begins: call it at the request, so that start silence counts. */
  start(stream: string, options: StartOptions = {}): void {
    this.call(() => {
      const tMs = checkTMs(this.clockMs());
      this.usable();
      const event = this.streams.start(stream, tMs, options);
      this.buffer.closeStream(stream);
      this.enqueue(event);
    });
  }

  /** A chunk of audio reached the player now (`audioMs`, or `pcmBytes` of the stream's format). */
  chunk(stream: string, options: ChunkOptions): void {
    this.call(() => {
      const tMs = checkTMs(this.clockMs());
      const now = this.monotonic();
      const into = this.buffer.mergeInto(stream, now);
      this.usable();
      const event = this.streams.chunk(stream, tMs, options, into);
      if (event === null) return;
      const final = options.final === true;
      if (event === into) this.buffer.mergedPiece(stream, final);
      else if (this.buffer.addChunk(stream, event, now, final)) this.schedule();
    });
  }

  /** The stream ended (`completed`, `cancelled`, `error`, …); nothing is needed after a final chunk. */
  end(stream: string, reason = "completed"): void {
    this.call(() => {
      const tMs = checkTMs(this.clockMs());
      this.usable();
      const event = this.streams.end(stream, tMs, reason);
      this.buffer.closeStream(stream);
      if (event !== null) this.enqueue(event);
    });
  }

  /** Count a failure of a hook (never thrown into the page). */
  noteError(error: unknown): void {
    this.errors += 1;
    this.once("hook", `edgemon reporter ${this.device}: ${String(error)} (counted in stats.errors)`);
  }

  // ---------------------------------------------------------------- inside
  private call(body: () => void): void {
    try {
      body();
    } catch (error) {
      if (error instanceof Conflict) this.conflict(error.kind, error.message);
      else if (error instanceof InvalidArgument) {
        this.invalid += 1;
        this.once("invalid", `edgemon reporter ${this.device}: ${error.message} (ignored; counted in stats.invalid, not logged again)`);
      } else {
        this.errors += 1;
        this.once("error", `edgemon reporter ${this.device}: ${String(error)} (counted in stats.errors)`);
      }
    }
  }

  private usable(): void {
    if (this.closed) throw new Conflict("closed", "this Reporter is closed: nothing more is sent");
    if (this.client === null) this.open();
  }

  private conflict(kind: ConflictKind, message: string): void {
    const seen = this.conflicts[kind] ?? 0;
    this.conflicts[kind] = seen + 1;
    if (seen === 0) {
      this.log(`edgemon reporter ${this.device}: ${message} (ignored; counted in stats.conflicts.${kind}, not logged again)`);
    }
  }

  private once(kind: string, message: string): void {
    if (this.said.has(kind)) return;
    this.said.add(kind);
    this.log(message);
  }

  private enqueue(event: Event): void {
    if (this.buffer.add(event)) this.schedule();
  }

  /** Arm the flush timer for when the next batch is due (or pump now). */
  private schedule(): void {
    if (this.timer !== undefined || this.closed) return;
    if (!this.connected || this.buffer.length === 0 || this.inFlight.size >= this.maxInFlight) return;
    const due = this.buffer.dueIn(this.urgent > 0);
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.pump();
    }, Math.max(0, due));
  }

  /** Publish what is due while connected and below `maxInFlight`. */
  private pump(): void {
    try {
      const client = this.client;
      while (client !== null && this.connected && this.buffer.length > 0
        && this.inFlight.size < this.maxInFlight && this.buffer.dueIn(this.urgent > 0) <= 0) {
        const taken = this.buffer.take();
        for (const [first, count, payload] of this.encode(taken)) this.publish(client, first, count, payload, taken);
      }
    } catch (error) {
      this.errors += 1;
      this.once("pump", `edgemon reporter ${this.device}: publishing failed: ${String(error)}`);
    }
    this.schedule();
  }

  private publish(client: MqttClient, first: number, count: number, payload: string, taken: Indexed[]): void {
    const token = this.nextToken++;
    this.inFlight.set(token, [first, count]);
    // Bytes, encoded natively: mqtt.js's Buffer polyfill encodes a string in a JavaScript
    // loop, which cost the page more than everything else the Reporter does (ASCII: the
    // events escape everything else).
    const bytes = this.encoder.encode(payload) as unknown as Buffer;
    client.publish(this.topic, bytes, { qos: 1 }, (error?: Error) => {
      this.inFlight.delete(token);
      if (error === undefined || error === null) {
        this.sent += count;
        this.messages += 1;
      } else if (!this.closed) {
        // Not acknowledged (the connection went away and the message with it): the events
        // go back ahead of newer ones; edgemon drops a duplicate by its seq.
        this.buffer.putBack(taken.filter(([idx]) => idx >= first && idx < first + count));
      }
      this.settled();
      this.schedule();
    });
  }

  /** JSON arrays of `taken`, each within `maxPayloadBytes`: (first index, count, text). */
  private encode(taken: Indexed[]): [number, number, string][] {
    const out: [number, number, string][] = [];
    let parts: string[] = [];
    let first = (taken[0] as Indexed)[0];
    let size = 2;
    for (const [idx, event] of taken) {
      const text = encodeEvent(event);
      if (parts.length && size + text.length + 1 > this.maxPayloadBytes) {
        out.push([first, parts.length, `[${parts.join(",")}]`]);
        parts = [];
        first = idx;
        size = 2;
      }
      parts.push(text);
      size += text.length + (parts.length > 1 ? 1 : 0);
    }
    out.push([first, parts.length, `[${parts.join(",")}]`]);
    return out;
  }

  private oldestUnsettled(): number {
    let oldest = this.buffer.oldest() ?? this.buffer.nextIdx;
    for (const [first] of this.inFlight.values()) if (first < oldest) oldest = first;
    return oldest;
  }

  private settled(): void {
    if (this.waiters.length === 0) return;
    const oldest = this.oldestUnsettled();
    for (const waiter of [...this.waiters]) if (oldest >= waiter.target) this.release(waiter, true);
  }

  private release(waiter: Waiter, done: boolean): void {
    const at = this.waiters.indexOf(waiter);
    if (at < 0) return;
    this.waiters.splice(at, 1);
    clearTimeout(waiter.timer);
    this.urgent -= 1;
    waiter.resolve(done);
  }
}
