/**
 * The events reported and not yet taken for sending (the Python client's `EventBuffer`):
 * oldest first, each with its index (the order of reporting), bounded: when it holds
 * `maxBuffered` events the oldest chunk goes (starts and ends stay; a buffer of nothing else
 * drops its oldest). A chunk event still waiting may take more pieces of its stream reported
 * within one flush window (`mergeInto`).
 */

import type { Event } from "./events.js";

export type Indexed = [number, Event];

export class EventBuffer {
  private pending: Indexed[] = [];
  private head = 0; // pending[head] is the oldest (a queue without shifting the array)
  private readonly openChunks = new Map<string, [number, Event]>();
  private firstAt = 0; // when the oldest waiting event was reported (monotonic ms)
  /** Index of the next event reported. */
  nextIdx = 0;
  events = 0;
  dropped = 0;
  merged = 0;

  constructor(
    readonly maxBuffered: number,
    readonly maxBatch: number,
    readonly flushMs: number,
    readonly merge: boolean,
    private readonly now: () => number,
    /** Pieces of one stream's chunk merge within this window (ms) of its first piece. */
    readonly mergeMs: number = flushMs,
  ) {}

  get length(): number {
    return this.pending.length - this.head;
  }

  /** Index of the oldest waiting event; null when none waits. */
  oldest(): number | null {
    return this.length ? (this.pending[this.head] as Indexed)[0] : null;
  }

  mergeInto(stream: string, now: number): Event | null {
    if (!this.merge) return null;
    const waiting = this.openChunks.get(stream);
    if (waiting !== undefined && now - waiting[0] <= this.mergeMs) return waiting[1];
    return null;
  }

  mergedPiece(stream: string, final: boolean): void {
    this.merged += 1;
    if (final) this.openChunks.delete(stream);
  }

  addChunk(stream: string, event: Event, now: number, final: boolean): boolean {
    if (final) this.openChunks.delete(stream);
    else if (this.merge) this.openChunks.set(stream, [now, event]);
    return this.add(event);
  }

  closeStream(stream: string): void {
    this.openChunks.delete(stream);
  }

  /** Append `event` (the oldest chunk goes when full); whether a flush should be scheduled:
   * the buffer was empty, or holds a full batch now. */
  add(event: Event): boolean {
    const wake = this.length === 0;
    if (wake) this.firstAt = this.now();
    else if (this.length >= this.maxBuffered) this.dropOldest();
    this.pending.push([this.nextIdx, event]);
    this.nextIdx += 1;
    this.events += 1;
    return wake || this.length === this.maxBatch;
  }

  dropOldest(): void {
    this.compact();
    const pending = this.pending;
    let position = pending.findIndex(([, e]) => e.type === "chunk");
    if (position < 0) position = 0;
    const [, event] = pending[position] as Indexed;
    pending.splice(position, 1);
    this.dropped += 1;
    const waiting = this.openChunks.get(event.stream as string);
    if (waiting !== undefined && waiting[1] === event) this.openChunks.delete(event.stream as string);
  }

  /** Milliseconds until a batch is due: 0 when `urgent` or a full batch waits. */
  dueIn(urgent: boolean): number {
    if (urgent || this.length >= this.maxBatch) return 0;
    return this.firstAt + this.flushMs - this.now();
  }

  /** The oldest events, at most a batch; what is left is due at once. */
  take(): Indexed[] {
    const count = Math.min(this.length, this.maxBatch);
    const taken = this.pending.slice(this.head, this.head + count);
    this.head += count;
    this.compact();
    this.openChunks.clear(); // taken events are final: no piece merges into them
    if (this.length) this.firstAt = this.now() - this.flushMs;
    return taken;
  }

  /** Put taken events back ahead of newer ones (the bound kept), due at once. */
  putBack(back: Indexed[]): void {
    this.compact();
    this.pending = [...back, ...this.pending];
    while (this.length > this.maxBuffered) this.dropOldest();
    this.firstAt = this.now() - this.flushMs;
  }

  private compact(): void {
    if (this.head === 0) return;
    if (this.head >= this.pending.length) this.pending = [];
    else this.pending = this.pending.slice(this.head);
    this.head = 0;
  }
}
