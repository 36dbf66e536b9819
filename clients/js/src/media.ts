/**
 * The media element hook: a page that plays a stream through Media Source Extensions on an
 * `<audio>` element (appending each chunk to a `SourceBuffer`). The element is the player:
 * it stalls by itself when its buffer runs dry (`waiting`, then `playing` when data came), and
 * pauses when the page or the listener pauses it (`pause`, `play`). Its `currentTime` stands
 * still in both, so the play start read through it (`Timeline`) moves later by every stall and
 * pause: the chunks carry it as `play_start_ms`, `start` names a `rebuffer` player, and
 * `stats` keeps the stalls (underruns the browser measured) apart from the pauses.
 */

import type { Reporter } from "./reporter.js";
import { Timeline } from "./timeline.js";

export interface MediaStreamOptions {
  marginMs?: number;
  /** The element's position (s) at which this stream's audio begins (default 0). */
  startPositionS?: number;
  stepMs?: number;
  playStartStepMs?: number;
}

export interface MediaStats {
  chunks: number;
  /** Stalls while playing (`waiting` … `playing`): underruns, and their time (ms). */
  underruns: number;
  underrunMs: number;
  pauses: number;
  pausedMs: number;
  playStartMs: number | null;
}

const EVENTS = ["playing", "waiting", "pause", "play", "ended"] as const;

export class MediaElementStream {
  private readonly timeline: Timeline;
  private readonly playStartStepMs: number;
  private started = false;
  private stalledAt: number | null = null;
  private pausedAt: number | null = null;
  private reportedStart: number | null = null;
  private closed = false;
  private readonly counts = { chunks: 0, underruns: 0, underrunMs: 0, pauses: 0, pausedMs: 0 };
  private readonly onEvent = (event: Event): void => this.handle(event.type);

  constructor(
    private readonly reporter: Reporter,
    private readonly element: HTMLMediaElement,
    readonly stream: string,
    private readonly options: MediaStreamOptions = {},
  ) {
    this.timeline = new Timeline(
      reporter.clockMs,
      () => element.currentTime * 1000,
      () => this.started && !element.paused && this.stalledAt === null,
      options.stepMs,
    );
    this.playStartStepMs = options.playStartStepMs ?? 2;
    for (const name of EVENTS) element.addEventListener(name, this.onEvent);
  }

  /** The request for the stream's audio was made (call it right before `fetch`). */
  request(): void {
    const options: { player: "rebuffer"; marginMs?: number } = { player: "rebuffer" };
    if (this.options.marginMs !== undefined) options.marginMs = this.options.marginMs;
    this.reporter.start(this.stream, options);
  }

  /** A chunk of `audioMs` arrived (call it when it is appended to the SourceBuffer). */
  chunk(audioMs: number, options: { final?: boolean; etaMs?: number } = {}): void {
    try {
      this.counts.chunks += 1;
      const chunk: { audioMs: number; final?: boolean; etaMs?: number; playStartMs?: number } = { audioMs };
      if (options.final) chunk.final = true;
      if (options.etaMs !== undefined) chunk.etaMs = options.etaMs;
      const playStart = this.playStart();
      if (playStart !== null) chunk.playStartMs = playStart;
      this.reporter.chunk(this.stream, chunk);
    } catch (error) {
      this.reporter.noteError(error);
    }
  }

  end(reason = "completed"): void {
    this.reporter.end(this.stream, reason);
    this.detach();
  }

  /** Stop listening to the element (after the stream's final chunk has played). */
  detach(): void {
    if (this.closed) return;
    this.closed = true;
    for (const name of EVENTS) this.element.removeEventListener(name, this.onEvent);
  }

  get stats(): MediaStats {
    const now = this.reporter.clockMs();
    return {
      ...this.counts,
      underrunMs: this.counts.underrunMs + (this.stalledAt === null ? 0 : now - this.stalledAt),
      pausedMs: this.counts.pausedMs + (this.pausedAt === null ? 0 : now - this.pausedAt),
      playStartMs: this.reportedStart,
    };
  }

  private playStart(): number | null {
    if (!this.started) return null;
    const value = this.timeline.at((this.options.startPositionS ?? 0) * 1000);
    if (this.reportedStart !== null && Math.abs(value - this.reportedStart) < this.playStartStepMs) return null;
    this.reportedStart = value;
    return value;
  }

  private handle(type: string): void {
    try {
      const now = this.reporter.clockMs();
      const element = this.element;
      if (type === "playing") {
        this.started = true;
        if (this.stalledAt !== null) {
          this.counts.underrunMs += now - this.stalledAt;
          this.stalledAt = null;
        }
      } else if (type === "waiting") {
        // The element ran out of data while it should play: a stall, unless paused or done.
        if (this.started && !element.paused && !element.ended && this.stalledAt === null) {
          this.stalledAt = now;
          this.counts.underruns += 1;
        }
      } else if (type === "pause") {
        if (this.started && !element.ended && this.pausedAt === null) {
          this.pausedAt = now;
          this.counts.pauses += 1;
        }
      } else if (type === "play") {
        if (this.pausedAt !== null) {
          this.counts.pausedMs += now - this.pausedAt;
          this.pausedAt = null;
        }
      } else if (type === "ended") {
        this.detach();
      }
      this.timeline.sample();
    } catch (error) {
      this.reporter.noteError(error);
    }
  }
}
