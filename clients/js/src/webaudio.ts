/**
 * The Web Audio hook: a page that plays a stream by scheduling decoded chunks as
 * `AudioBufferSourceNode`s back to back on an `AudioContext` (the common way to play
 * streamed TTS with low latency). `WebAudioStream.play(buffer)` schedules a chunk the moment
 * it arrived and reports it; the hook keeps the schedule, so it knows, on the context's own
 * clock, when the stream started, when it ran dry before a chunk came (an underrun: the late
 * chunk plays as soon as it can, a `rebuffer` player) and for how long the context was
 * suspended (a pause). It reports them as edgemon understands them: `start` at the request
 * with `player: "rebuffer"`, each chunk on arrival, and `play_start_ms` moved later by every
 * pause and stall, so edgemon's slack is the audio the listener has ahead and a pause never
 * looks like an underrun.
 *
 * Underruns the browser measured: those derived from the schedule (a chunk that came after
 * the audio before it had played out), and the audio device's own (`AudioPlaybackStats`,
 * `audioContext.playbackStats`, where the browser has it: frames the device played as
 * silence because the graph was late) — both in `stats`; the device's stall also moves the
 * context's clock, so `play_start_ms` carries it.
 */

import type { Reporter } from "./reporter.js";
import { Timeline } from "./timeline.js";

interface PlaybackStats {
  readonly underrunEvents: number;
  readonly underrunDuration: number;
}

export interface WebAudioStreamOptions {
  /** Where the chunks play (default `context.destination`). */
  destination?: AudioNode;
  /** The margin this stream asks edgemon for. */
  marginMs?: number;
  /** How far ahead of the context's clock a chunk that arrives to an empty schedule is
   * started (s): the first chunk, and one after an underrun. */
  leadS?: number;
  /** The context's clock steps (ms): see `Timeline`. */
  stepMs?: number;
  /** Report `play_start_ms` again when it moved by at least this (ms). */
  playStartStepMs?: number;
}

export interface WebAudioStats {
  chunks: number;
  /** Underruns derived from the schedule, and their audio time (ms). */
  underruns: number;
  underrunMs: number;
  /** Pauses (the context suspended while the stream played) and their time (ms). */
  pauses: number;
  pausedMs: number;
  /** The audio device's own underruns while the stream lived (`AudioPlaybackStats`), or
   * null where the browser does not have them. */
  deviceUnderruns: number | null;
  deviceUnderrunMs: number | null;
  /** The play start reported last (Reporter clock, ms), or null before playback. */
  playStartMs: number | null;
}

export class WebAudioStream {
  private readonly timeline: Timeline;
  private readonly destination: AudioNode;
  private readonly leadS: number;
  private readonly playStartStepMs: number;
  private firstS: number | null = null; // context time of the first audio
  private nextS = 0; // context time at which the scheduled audio ends
  private stalledMs = 0; // the stream's own stalls (underruns), media ms
  private reportedStart: number | null = null;
  private pausedAt: number | null = null; // Reporter clock when the context stopped
  private deviceBase: PlaybackStats | null = null;
  private ended = false;
  private readonly counts = { chunks: 0, underruns: 0, underrunMs: 0, pauses: 0, pausedMs: 0 };
  private readonly onState = (): void => this.stateChanged();

  constructor(
    private readonly reporter: Reporter,
    private readonly context: AudioContext,
    readonly stream: string,
    private readonly options: WebAudioStreamOptions = {},
  ) {
    const clock = reporter.clockMs;
    this.timeline = new Timeline(
      clock, () => context.currentTime * 1000, () => context.state === "running", options.stepMs,
    );
    this.destination = options.destination ?? context.destination;
    this.leadS = options.leadS ?? 0;
    this.playStartStepMs = options.playStartStepMs ?? 2;
    context.addEventListener("statechange", this.onState);
  }

  /** The request for the stream's audio was made (call it right before `fetch`). */
  request(): void {
    const options: { player: "rebuffer"; marginMs?: number } = { player: "rebuffer" };
    if (this.options.marginMs !== undefined) options.marginMs = this.options.marginMs;
    this.reporter.start(this.stream, options);
  }

  /** A decoded chunk arrived: schedule it after the audio before it (or now, if that has
   * played out) and report it. Returns the source node (null if the hook failed: it never
   * throws into the page). */
  play(buffer: AudioBuffer, options: { final?: boolean; etaMs?: number } = {}): AudioBufferSourceNode | null {
    let node: AudioBufferSourceNode | null = null;
    try {
      // Each reading of the page's clocks and the buffer is taken once: this runs on the
      // page's main thread for every chunk.
      const context = this.context;
      const now = context.currentTime;
      const clockMs = this.reporter.clockMs();
      const frames = buffer.length;
      const rate = buffer.sampleRate;
      let at = this.nextS;
      if (this.firstS === null) {
        at = now + this.leadS;
        this.firstS = at;
        this.deviceBase = this.deviceStats();
      } else if (at < now) {
        // The schedule ran dry before this chunk came: an underrun of the listener's audio.
        const resume = now + this.leadS;
        this.counts.underruns += 1;
        this.counts.underrunMs += (resume - at) * 1000;
        this.stalledMs += (resume - at) * 1000;
        at = resume;
      }
      node = context.createBufferSource();
      node.buffer = buffer;
      node.connect(this.destination);
      node.start(at);
      this.nextS = at + frames / rate;
      this.counts.chunks += 1;
      // audio_ms from the chunk's own frames at its own rate: what the Python client computes
      // from the same PCM (a context at another rate resamples it, the duration stays).
      const chunk: { audioMs: number; final?: boolean; etaMs?: number; playStartMs?: number } = {
        audioMs: (frames * 1000) / rate,
      };
      if (options.final) chunk.final = true;
      if (options.etaMs !== undefined) chunk.etaMs = options.etaMs;
      const playStart = this.playStart(this.timeline.sampleAt(clockMs, now * 1000));
      if (playStart !== null) chunk.playStartMs = playStart;
      this.reporter.chunkAt(this.stream, clockMs, chunk);
      if (options.final) this.finish();
    } catch (error) {
      this.reporter.noteError(error);
    }
    return node;
  }

  /** Pause the stream's playback (suspends the context: a pause, never an underrun). */
  pause(): Promise<void> {
    return this.context.suspend().catch((error: unknown) => this.reporter.noteError(error));
  }

  /** Resume after `pause()`. */
  resume(): Promise<void> {
    return this.context.resume().catch((error: unknown) => this.reporter.noteError(error));
  }

  /** The stream ended before its final chunk (`cancelled`, `error`, …). */
  end(reason = "completed"): void {
    this.reporter.end(this.stream, reason);
    this.finish();
  }

  get stats(): WebAudioStats {
    const device = this.deviceStats();
    const base = this.deviceBase;
    const paused = this.pausedAt === null ? 0 : this.reporter.clockMs() - this.pausedAt;
    return {
      ...this.counts,
      pausedMs: this.counts.pausedMs + paused,
      deviceUnderruns: device === null ? null : device.underrunEvents - (base?.underrunEvents ?? 0),
      deviceUnderrunMs: device === null ? null
        : (device.underrunDuration - (base?.underrunDuration ?? 0)) * 1000,
      playStartMs: this.reportedStart,
    };
  }

  /** `play_start_ms` to send with a chunk, from the media clock's `offset` now: when it moved
   * (or was never sent), else null. */
  private playStart(offset: number): number | null {
    if (this.firstS === null) return null;
    const value = offset + this.firstS * 1000 + this.stalledMs;
    if (this.reportedStart !== null && Math.abs(value - this.reportedStart) < this.playStartStepMs) return null;
    this.reportedStart = value;
    return value;
  }

  private stateChanged(): void {
    if (this.ended || this.firstS === null) return;
    const clock = this.reporter.clockMs();
    if (this.context.state !== "running") {
      if (this.pausedAt === null) {
        this.pausedAt = clock;
        this.counts.pauses += 1;
      }
    } else if (this.pausedAt !== null) {
      this.counts.pausedMs += clock - this.pausedAt;
      this.pausedAt = null;
    }
  }

  private deviceStats(): PlaybackStats | null {
    const stats = (this.context as unknown as { playbackStats?: PlaybackStats }).playbackStats;
    if (stats === undefined || stats === null) return null;
    return { underrunEvents: stats.underrunEvents, underrunDuration: stats.underrunDuration };
  }

  private finish(): void {
    this.ended = true;
    this.context.removeEventListener("statechange", this.onState);
  }
}
