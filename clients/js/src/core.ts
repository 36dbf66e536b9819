/**
 * `ReporterCore`: what a `Reporter` does with the calls once they are stamped, wherever it
 * runs (in the Reporter's Web Worker, or in the page when no worker can start): the events
 * built and checked, buffered, batched, encoded and published over MQTT on a WebSocket
 * (mqtt.ts, the Reporter's own link), QoS 1. The page's `Reporter` (reporter.ts) reads the clocks and passes every call
 * here with its `t_ms` (the event clock) and `now` (the monotonic clock of merge windows):
 * the core reads no page clock, so it works the same on either side of a `postMessage`.
 *
 * - **Calls** (`start`, `chunk`, `end`) check their arguments and append the event to a
 *   bounded buffer; they never wait for the network and **never throw**: a bad argument is
 *   counted (`stats.invalid`), a call the stream's state makes moot too (`stats.conflicts`),
 *   each kind logged once.
 * - **Batching.** What was reported within `flushMs` of the oldest waiting event goes out as
 *   one JSON array on `P/{device}/events` (QoS 1), split to stay within edgemon's default
 *   `max_batch_events` and `max_payload_bytes`; chunks of one stream reported within
 *   `mergeMs` of the first become one event (audio summed, `t_ms` the last piece's arrival).
 *   The flush windows run on `monotonic` (the core's own side's clock).
 * - **Offline.** A broker that is down or unreachable costs a counter (`stats.connectErrors`)
 *   and a bounded buffer: when it holds `maxBufferedEvents` the oldest chunk is dropped and
 *   counted (`stats.dropped`); later chunks carry `audio_total_ms`, so edgemon resynchronises.
 */

import { EventBuffer, type Indexed } from "./buffer.js";
import {
  type ChunkOptions, checkTMs, Conflict, type ConflictKind, type Event, parseFormat,
  type StartOptions, Streams,
} from "./events.js";
import { encodeEvent } from "./json.js";
import { type LinkOptions, MqttLink } from "./mqtt.js";
import { InvalidArgument } from "./protocol.js";

/** What a core is made of: the Reporter's options, checked and resolved by the page's
 * `Reporter` (plain data: it crosses to the worker by `postMessage`). */
export interface CoreSettings {
  device: string;
  topic: string;
  clientId: string;
  username: string;
  password?: string;
  audioFormat?: string;
  flushMs: number;
  mergeMs: number;
  mergeChunks: boolean;
  maxBufferedEvents: number;
  maxBatchEvents: number;
  maxPayloadBytes: number;
  maxInFlight: number;
  maxStreams: number;
  reconnectPeriodMs: number;
  connectTimeoutMs: number;
  keepaliveS: number;
}

/** The core's counters (the page's `ReporterStats` adds its own side's). */
export interface CoreStats {
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

export class ReporterCore {
  private readonly log: (message: string) => void;
  private readonly changed: () => void;
  private readonly streams: Streams;
  private readonly buffer: EventBuffer;
  private client: MqttLink | null = null;
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

  /** `monotonic`: the clock of flush windows (ms); `log`: where the first warning of each
   * kind goes; `changed`: called when the connection's state or counters changed. */
  constructor(
    private readonly url: string,
    private readonly settings: CoreSettings,
    monotonic: () => number,
    log: (message: string) => void,
    changed: () => void = () => {},
  ) {
    this.log = log;
    this.changed = changed;
    const format = settings.audioFormat === undefined ? null : parseFormat(settings.audioFormat);
    this.streams = new Streams(settings.maxStreams, format);
    this.buffer = new EventBuffer(
      settings.maxBufferedEvents, settings.maxBatchEvents, settings.flushMs, settings.mergeChunks,
      monotonic, settings.mergeMs,
    );
  }

  // ---------------------------------------------------------------- lifecycle
  /** Connect in the background (never waits, never throws); idempotent. */
  open(): this {
    if (this.closed || this.client !== null) return this;
    const { device } = this.settings;
    try {
      const options: LinkOptions = {
        clientId: this.settings.clientId,
        username: this.settings.username,
        keepaliveS: this.settings.keepaliveS,
        reconnectPeriodMs: this.settings.reconnectPeriodMs,
        connectTimeoutMs: this.settings.connectTimeoutMs,
      };
      if (this.settings.password !== undefined) options.password = this.settings.password;
      const client = new MqttLink(this.url, options, {
        connect: () => {
          this.connected = true;
          this.connects += 1;
          this.unreachableSaid = false;
          this.schedule();
          this.changed();
        },
        close: () => {
          if (this.connected && !this.closed) this.once("lost", `edgemon reporter ${device}: lost the broker; buffering events until it is back`);
          this.connected = false;
          this.changed();
        },
        error: (error: Error) => {
          this.connectErrors += 1;
          if (!this.unreachableSaid) {
            this.unreachableSaid = true;
            this.log(`edgemon reporter ${device}: cannot reach the broker (${error.message}); retrying, events wait in the buffer`);
          }
          this.changed();
        },
      });
      this.client = client;
    } catch (error) {
      this.connectErrors += 1;
      this.once("open", `edgemon reporter ${device}: could not connect: ${(error as Error).message}`);
      this.changed();
    }
    return this;
  }

  get isConnected(): boolean {
    return this.connected;
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
        client.end(resolve);
      });
    }
  }

  get stats(): CoreStats {
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
  /** A stream began at `tMs` (the event clock). */
  start(stream: string, tMs: number, options: StartOptions): void {
    this.call(() => {
      const t = checkTMs(tMs);
      this.usable();
      const event = this.streams.start(stream, t, options);
      this.buffer.closeStream(stream);
      this.enqueue(event);
    });
  }

  /** A chunk reached the player at `tMs` (the event clock), `now` on the clock of merge
   * windows. */
  chunk(stream: string, tMs: number, now: number, options: ChunkOptions): void {
    this.call(() => {
      const t = checkTMs(tMs);
      const into = this.buffer.mergeInto(stream, now);
      this.usable();
      const event = this.streams.chunk(stream, t, options, into);
      if (event === null) return;
      const final = options.final === true;
      if (event === into) this.buffer.mergedPiece(stream, final);
      else if (this.buffer.addChunk(stream, event, now, final)) this.schedule();
    });
  }

  /** The stream ended at `tMs` (the event clock). */
  end(stream: string, tMs: number, reason: string): void {
    this.call(() => {
      const t = checkTMs(tMs);
      this.usable();
      const event = this.streams.end(stream, t, reason);
      this.buffer.closeStream(stream);
      if (event !== null) this.enqueue(event);
    });
  }

  /** Count a failure (never thrown into the page). */
  noteError(error: unknown): void {
    this.errors += 1;
    this.once("hook", `edgemon reporter ${this.settings.device}: ${String(error)} (counted in stats.errors)`);
  }

  // ---------------------------------------------------------------- inside
  private call(body: () => void): void {
    try {
      body();
    } catch (error) {
      const device = this.settings.device;
      if (error instanceof Conflict) this.conflict(error.kind, error.message);
      else if (error instanceof InvalidArgument) {
        this.invalid += 1;
        this.once("invalid", `edgemon reporter ${device}: ${error.message} (ignored; counted in stats.invalid, not logged again)`);
      } else {
        this.errors += 1;
        this.once("error", `edgemon reporter ${device}: ${String(error)} (counted in stats.errors)`);
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
      this.log(`edgemon reporter ${this.settings.device}: ${message} (ignored; counted in stats.conflicts.${kind}, not logged again)`);
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
    if (!this.connected || this.buffer.length === 0 || this.inFlight.size >= this.settings.maxInFlight) return;
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
        && this.inFlight.size < this.settings.maxInFlight && this.buffer.dueIn(this.urgent > 0) <= 0) {
        const taken = this.buffer.take();
        for (const [first, count, payload] of this.encode(taken)) this.publish(client, first, count, payload, taken);
      }
    } catch (error) {
      this.errors += 1;
      this.once("pump", `edgemon reporter ${this.settings.device}: publishing failed: ${String(error)}`);
    }
    this.schedule();
  }

  private publish(client: MqttLink, first: number, count: number, payload: string, taken: Indexed[]): void {
    const token = this.nextToken++;
    this.inFlight.set(token, [first, count]);
    client.publish(this.settings.topic, this.encoder.encode(payload), (error?: Error) => {
      this.inFlight.delete(token);
      if (error === undefined) {
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
      if (parts.length && size + text.length + 1 > this.settings.maxPayloadBytes) {
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
