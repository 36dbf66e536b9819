/**
 * Event objects built from a player's calls, checked as edgemon checks them (the Python
 * client's `_events.py`, call for call): the next `seq`, the exact audio total, a partial PCM
 * frame carried to the next chunk. A bad argument throws `InvalidArgument`; a call that
 * conflicts with the stream's state throws `Conflict`; the Reporter catches both, counts
 * them and never lets them reach the page.
 */

import { AudioTotal } from "./exact.js";
import {
  InvalidArgument,
  MAX_AUDIO_MS,
  MAX_ETA_MS,
  MAX_MARGIN_MS,
  MAX_REASON,
  MAX_TIME_MS,
  PLAYERS,
  STREAM_ID,
} from "./protocol.js";

/** How many ended stream ids are remembered to refuse chunks after `end()`. */
export const ENDED_MEMORY = 4096;

export type Event = Record<string, string | number | boolean>;

export type ConflictKind = "ended" | "unknown" | "live" | "max_streams" | "closed";

/** A call that the stream's state makes moot; nothing is queued for it. */
export class Conflict extends Error {
  constructor(
    readonly kind: ConflictKind,
    message: string,
  ) {
    super(message);
  }
}

const SAMPLE_BYTES: Readonly<Record<string, number>> = {
  s16le: 2, s16be: 2, s24le: 3, s24be: 3, s32le: 4, s32be: 4, f32le: 4, f32be: 4,
};

/** Interleaved raw PCM, written `ENCODING:RATE:CHANNELS` (e.g. `s16le:24000:1`). */
export interface AudioFormat {
  readonly encoding: string;
  readonly rate: number;
  readonly channels: number;
}

/** An audio format from its text form; InvalidArgument if it is not one. */
export function parseFormat(text: string): AudioFormat {
  if (typeof text !== "string") {
    throw new InvalidArgument(`audio format must be ENCODING:RATE:CHANNELS, not ${String(text)}`);
  }
  const parts = text.trim().toLowerCase().split(":");
  const [encoding = "", rate = "", channels = ""] = parts;
  if (parts.length !== 3 || !/^\d+$/.test(rate) || !/^\d+$/.test(channels)) {
    throw new InvalidArgument(`audio format ${JSON.stringify(text)} must be ENCODING:RATE:CHANNELS`);
  }
  if (!(encoding in SAMPLE_BYTES)) throw new InvalidArgument(`unknown PCM encoding ${encoding}`);
  const format = { encoding, rate: Number(rate), channels: Number(channels) };
  if (!(format.rate > 0 && format.rate <= 768_000)) {
    throw new InvalidArgument("sample rate must be an integer in 1..768000 Hz");
  }
  if (!(format.channels > 0 && format.channels <= 8)) {
    throw new InvalidArgument("channels must be an integer in 1..8");
  }
  return format;
}

function frameBytes(format: AudioFormat): number {
  return (SAMPLE_BYTES[format.encoding] ?? 0) * format.channels;
}

function sameFormat(a: AudioFormat | null, b: AudioFormat | null): boolean {
  return a === b || (a !== null && b !== null && a.encoding === b.encoding
    && a.rate === b.rate && a.channels === b.channels);
}

/** A number argument within its bounds (`openLow`: the low bound excluded). */
export function checkedNumber(
  name: string, value: unknown, low: number, high: number, openLow: boolean,
): number {
  if (typeof value !== "number") throw new InvalidArgument(`${name} must be a number, not ${String(value)}`);
  if (!Number.isFinite(value)) throw new InvalidArgument(`${name} must be finite, not ${value}`);
  if ((openLow ? value <= low : value < low) || value > high) {
    throw new InvalidArgument(`${name} must be ${low} ${openLow ? "<" : "≤"} x ≤ ${high}, not ${value}`);
  }
  return value;
}

/** The clock's reading as a wire time (finite, 0 ≤ t ≤ 2**53). */
export function checkTMs(tMs: number): number {
  return checkedNumber("t_ms (from the clock)", tMs, 0, MAX_TIME_MS, false);
}

export function checkStreamId(stream: unknown): string {
  if (typeof stream !== "string" || !STREAM_ID.test(stream)) {
    throw new InvalidArgument(`stream ${String(stream)} must match [A-Za-z0-9._:-]{1,128}`);
  }
  return stream;
}

class StreamState {
  sent = false; // whether edgemon has heard of it (a start or a chunk went out)
  nextSeq = 0;
  readonly total = new AudioTotal();
  carry = 0; // bytes of a partial frame, waiting for the next chunk
  carryFormat: AudioFormat | null = null;
  constructor(readonly format: AudioFormat | null) {}
}

export interface StartOptions {
  playStartMs?: number;
  marginMs?: number;
  player?: "conceal" | "rebuffer";
  audioFormat?: string;
}

export interface ChunkOptions {
  /** The audio this chunk holds (exactly one of `audioMs` and `pcmBytes`). */
  audioMs?: number;
  /** Bytes of raw PCM in the stream's audio format. */
  pcmBytes?: number;
  audioFormat?: string;
  /** Expected time from now until the next chunk arrives. */
  etaMs?: number;
  final?: boolean;
  /** When the player starts (or started) playing, on the Reporter's clock. */
  playStartMs?: number;
}

/** Merge a piece that arrived at `tMs` into the waiting chunk `event` (Python's `_merge`). */
function merge(event: Event, tMs: number, ms: number, totalMs: number, eta: number | null): void {
  const before = event.t_ms as number;
  event.t_ms = Math.max(before, tMs);
  event.audio_ms = (event.audio_ms as number) + ms;
  event.audio_total_ms = totalMs;
  if (eta !== null) {
    event.eta_ms = eta;
  } else if ("eta_ms" in event) {
    event.eta_ms = Math.max(0, (event.eta_ms as number) - ((event.t_ms as number) - before));
  }
}

/** The live streams of one device, as the Reporter has reported them. */
export class Streams {
  private readonly live = new Map<string, StreamState>();
  private readonly ended = new Map<string, boolean>(); // id -> ended by a final chunk

  constructor(
    readonly maxStreams: number,
    readonly audioFormat: AudioFormat | null = null,
  ) {}

  start(stream: string, tMs: number, options: StartOptions = {}): Event {
    checkStreamId(stream);
    const format = options.audioFormat === undefined ? null : parseFormat(options.audioFormat);
    const event: Event = { type: "start", stream, t_ms: tMs };
    if (options.playStartMs !== undefined) {
      event.play_start_ms = checkedNumber("play_start_ms", options.playStartMs, 0, MAX_TIME_MS, false);
    }
    if (options.marginMs !== undefined) {
      event.margin_ms = checkedNumber("margin_ms", options.marginMs, 0, MAX_MARGIN_MS, false);
    }
    if (options.player !== undefined) {
      if (!PLAYERS.has(options.player)) {
        throw new InvalidArgument(`player must be 'conceal' or 'rebuffer', not ${String(options.player)}`);
      }
      event.player = options.player;
    }
    if (this.live.has(stream)) throw new Conflict("live", `stream ${stream} has already started`);
    this.refuseNew(stream);
    this.add(stream, format ?? this.audioFormat).sent = true;
    return event;
  }

  /** The chunk event, or null when the bytes complete no frame yet (carried); merged into
   * `into` (the stream's previous chunk event, still waiting) when given. */
  chunk(stream: string, tMs: number, options: ChunkOptions, into: Event | null = null): Event | null {
    checkStreamId(stream);
    const final = options.final ?? false;
    if (typeof final !== "boolean") throw new InvalidArgument(`final must be true or false, not ${String(final)}`);
    const eta = options.etaMs === undefined ? null
      : checkedNumber("eta_ms", options.etaMs, 0, MAX_ETA_MS, false);
    const playStart = options.playStartMs === undefined ? null
      : checkedNumber("play_start_ms", options.playStartMs, 0, MAX_TIME_MS, false);
    const override = options.audioFormat === undefined ? null : parseFormat(options.audioFormat);
    if ((options.audioMs === undefined) === (options.pcmBytes === undefined)) {
      throw new InvalidArgument("give exactly one of audioMs and pcmBytes");
    }
    const msGiven = options.audioMs === undefined ? null
      : checkedNumber("audio_ms", options.audioMs, 0, MAX_AUDIO_MS, true);
    let state = this.live.get(stream);
    if (state === undefined) this.refuseNew(stream);
    let ms: number;
    let carry: number;
    let carryFormat: AudioFormat | null;
    if (options.pcmBytes !== undefined) {
      const format = override ?? (state !== undefined ? state.format : this.audioFormat);
      const [frames, fmt, left] = this.pcm(stream, state, options.pcmBytes, format, final);
      if (state === undefined) state = this.add(stream, this.audioFormat);
      carry = left;
      carryFormat = left ? fmt : null;
      if (frames === 0) { // no whole frame yet: the bytes wait for the next chunk
        state.carry = carry;
        state.carryFormat = carryFormat;
        return null;
      }
      ms = state.total.addFrames(frames, fmt.rate);
    } else {
      ms = msGiven as number;
      if (state === undefined) state = this.add(stream, this.audioFormat);
      carry = state.carry;
      carryFormat = state.carryFormat;
      state.total.addMs(ms);
    }
    state.sent = true;
    let event: Event;
    if (into !== null) {
      event = into;
      merge(event, tMs, ms, state.total.totalMs(), eta);
    } else {
      event = {
        type: "chunk", stream, t_ms: tMs, seq: state.nextSeq, audio_ms: ms,
        audio_total_ms: state.total.totalMs(),
      };
      if (eta !== null) event.eta_ms = eta;
      state.nextSeq += 1;
    }
    if (playStart !== null) event.play_start_ms = playStart;
    if (final) {
      event.final = true;
      this.finish(stream, true);
    } else {
      state.carry = carry;
      state.carryFormat = carryFormat;
    }
    return event;
  }

  /** The end event, or null after a final chunk (the stream is complete already). */
  end(stream: string, tMs: number, reason: string): Event | null {
    checkStreamId(stream);
    if (typeof reason !== "string" || [...reason].length > MAX_REASON) {
      throw new InvalidArgument(`reason must be a string of at most ${MAX_REASON} characters`);
    }
    const state = this.live.get(stream);
    if (state === undefined) {
      if (this.ended.get(stream)) return null;
      if (this.ended.has(stream)) throw new Conflict("ended", `stream ${stream} has already ended`);
      throw new Conflict("unknown", `unknown stream ${stream}: nothing was reported for it`);
    }
    this.finish(stream, false);
    if (!state.sent) return null; // only a partial frame was ever given
    return { type: "end", stream, t_ms: tMs, reason };
  }

  private pcm(
    stream: string, state: StreamState | undefined, pcmBytes: number,
    format: AudioFormat | null, final: boolean,
  ): [number, AudioFormat, number] {
    if (typeof pcmBytes !== "number" || !Number.isInteger(pcmBytes) || pcmBytes <= 0) {
      throw new InvalidArgument(`pcmBytes must be an integer > 0, not ${String(pcmBytes)}`);
    }
    if (format === null) {
      throw new InvalidArgument(`pcmBytes of stream ${stream} in an unknown audio format: give audioFormat`);
    }
    const carried = state === undefined ? 0 : state.carry;
    if (carried && state !== undefined && !sameFormat(state.carryFormat, format)) {
      throw new InvalidArgument(`stream ${stream} carries ${carried} bytes of a partial frame of another format`);
    }
    const size = frameBytes(format);
    const frames = Math.floor((pcmBytes + carried) / size);
    const carry = (pcmBytes + carried) % size;
    if (frames * 1000 > MAX_AUDIO_MS * format.rate) {
      throw new InvalidArgument(`pcmBytes=${pcmBytes} is more than ${MAX_AUDIO_MS} ms`);
    }
    if (frames === 0 && final) {
      throw new InvalidArgument("a final chunk must hold a whole frame of audio; call end() instead");
    }
    return [frames, format, carry];
  }

  private add(stream: string, format: AudioFormat | null): StreamState {
    const state = new StreamState(format);
    this.live.set(stream, state);
    return state;
  }

  private refuseNew(stream: string): void {
    if (this.ended.has(stream)) {
      throw new Conflict("ended", `stream ${stream} has ended: a new stream needs a new id`);
    }
    if (this.live.size >= this.maxStreams) {
      throw new Conflict("max_streams", `more than ${this.maxStreams} live streams; end() the finished ones`);
    }
  }

  private finish(stream: string, byFinal: boolean): void {
    this.live.delete(stream);
    this.ended.delete(stream);
    this.ended.set(stream, byFinal);
    if (this.ended.size > ENDED_MEMORY) {
      this.ended.delete(this.ended.keys().next().value as string);
    }
  }
}
