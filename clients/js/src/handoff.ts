/**
 * The hand-off through shared memory: on a cross-origin isolated page (COOP `same-origin`
 * and COEP `require-corp`, so `SharedArrayBuffer` exists), the page writes each chunk call
 * into a ring of slots the worker reads, instead of a `postMessage` that wakes the worker for
 * every chunk. What a message costs the page is mostly that wake: about 18 µs a chunk, 0.9 ms
 * a second at 4 streams of 12.5 chunks a second; a slot costs its stores
 * (docs/how-to/web-player.md, "What was measured").
 *
 * - **What goes on the ring**: chunk calls whose fields are plain numbers (and `final` a
 *   boolean), of a stream the worker already knows by a number of its own (a handle). A
 *   stream's first call, a start, an end, a chunk naming an audio format, a field of another
 *   type (for the core to count as invalid) and a call that finds the ring full go by message,
 *   carrying their stream's handle.
 * - **Order.** Every call is numbered; the worker applies them strictly in that order, a ring
 *   slot only once every call before it was applied (a message posted before it may still be
 *   on its way). A message's calls reach the worker after every slot written before it.
 * - **Waking.** While calls come the worker reads the ring every `POLL_MS`; after `IDLE_MS`
 *   of nothing it says it sleeps, and the page's next call wakes it with one message.
 */

import { type Call, CHUNK, END } from "./calls.js";

/** How often an awake worker reads the ring (ms): browsers clamp shorter repeated timers to
 * 4 ms. An event waits up to this before its `flushMs` window starts. */
export const POLL_MS = 4;
/** How long a worker with nothing to read stays awake (ms). */
export const IDLE_MS = 1_000;
/** Slots in the ring: beyond it, calls go by message. */
const CAPACITY = 1_024;
/** Stream handles the page keeps at once (a stream's is dropped with its end or final chunk). */
const MAX_HANDLES = 4_096;

// The control words (Int32, first in the buffer), then the slots (Float64).
const WRITE = 0; // slots written, ever (the page's)
const READ = 1; // slots read, ever (the worker's)
const SLEEPING = 2; // 1 while the worker reads nothing until woken
const CONTROL_BYTES = 16;
// A slot: the call's number, its stream's handle, t_ms, now, then the options, and which of
// them were given.
const SLOT = 9;
const AUDIO_MS = 1;
const PCM_BYTES = 2;
const ETA_MS = 4;
const PLAY_START_MS = 8;
const FINAL = 16;
const NOT_FINAL = 32;

/** A call that went by message, when the ring is in use: `[kind, number, call, handle]`
 * (handle 0: none; call null: a call that could not be posted, skipped). */
export type NumberedCall = [kind: "call", n: number, call: Call | null, handle: number];

/** Whether this page can share memory with its worker. */
export function canShare(): boolean {
  return typeof SharedArrayBuffer === "function" && globalThis.crossOriginIsolated === true;
}

/** Whether `call` is the last its stream's handle is used for. */
function lastOfStream(call: Call): boolean {
  return call[0] === END || (call[0] === CHUNK && call[8] === true);
}

/** The page's end. */
export class RingWriter {
  readonly buffer = new SharedArrayBuffer(CONTROL_BYTES + CAPACITY * SLOT * 8);
  private readonly control = new Int32Array(this.buffer, 0, 4);
  private readonly slots = new Float64Array(this.buffer, CONTROL_BYTES);
  private readonly handles = new Map<string, number>();
  private nextHandle = 1;
  private n = 0;

  /** Hand `call` over: null when it went on the ring (`wake()` next), else the message to post. */
  hand(call: Call): NumberedCall | null {
    const n = this.n++;
    const stream = call[1];
    let handle = this.handles.get(stream) ?? 0;
    if (handle !== 0 && call[0] === CHUNK && this.put(n, handle, call)) {
      if (lastOfStream(call)) this.handles.delete(stream);
      return null;
    }
    if (lastOfStream(call)) this.handles.delete(stream);
    else if (handle === 0 && this.handles.size < MAX_HANDLES && typeof stream === "string") {
      handle = this.nextHandle++;
      this.handles.set(stream, handle);
    }
    return ["call", n, call, handle];
  }

  /** The message to post in place of `message`, which could not be posted (an argument the
   * structured clone cannot copy): the worker skips its number. Its stream's handle is
   * forgotten, since the worker may never have learnt it: the stream's next call names it. */
  refused(message: NumberedCall): NumberedCall {
    const call = message[2];
    if (call !== null) this.handles.delete(call[1]);
    return ["call", message[1], null, 0];
  }

  /** After a call went on the ring: whether the worker sleeps and must be woken with a message
   * (it is counted awake from now). */
  wake(): boolean {
    return Atomics.load(this.control, SLEEPING) === 1 && Atomics.compareExchange(this.control, SLEEPING, 1, 0) === 1;
  }

  private put(n: number, handle: number, call: Call): boolean {
    if (call[6] !== undefined) return false; // an audio format: by message
    const written = Atomics.load(this.control, WRITE);
    if (written - Atomics.load(this.control, READ) >= CAPACITY) return false;
    const at = (written % CAPACITY) * SLOT;
    const slots = this.slots;
    let given = this.option(at + 4, call[4], AUDIO_MS) | this.option(at + 5, call[5], PCM_BYTES)
      | this.option(at + 6, call[7], ETA_MS) | this.option(at + 7, call[9], PLAY_START_MS);
    if (given < 0) return false; // an option not a number: by message
    const final = call[8];
    if (final === true) given |= FINAL;
    else if (final === false) given |= NOT_FINAL;
    else if (final !== undefined) return false;
    const tMs = call[2];
    const now = call[3];
    if (typeof tMs !== "number" || typeof now !== "number") return false;
    slots[at] = n;
    slots[at + 1] = handle;
    slots[at + 2] = tMs;
    slots[at + 3] = now;
    slots[at + 8] = given;
    Atomics.store(this.control, WRITE, written + 1);
    return true;
  }

  /** Write an option at `index`: its `bit` when given, 0 when not, -1 when not a number. */
  private option(index: number, value: unknown, bit: number): number {
    if (value === undefined) return 0;
    if (typeof value !== "number") return -1;
    this.slots[index] = value;
    return bit;
  }
}

/** The worker's end: applies the calls of the ring and of the messages in their order. */
export class RingReader {
  private readonly control: Int32Array;
  private readonly slots: Float64Array;
  private readonly names = new Map<number, string>();
  private expected = 0;

  constructor(buffer: SharedArrayBuffer, private readonly apply: (call: Call) => void) {
    this.control = new Int32Array(buffer, 0, 4);
    this.slots = new Float64Array(buffer, CONTROL_BYTES);
  }

  /** Apply the ring's calls while the next is the one due; how many were applied. */
  drain(): number {
    let applied = 0;
    let read = Atomics.load(this.control, READ);
    const written = Atomics.load(this.control, WRITE);
    while (read < written) {
      const at = (read % CAPACITY) * SLOT;
      if (this.slots[at] !== this.expected) break; // a message before it is on its way
      this.take(at);
      read += 1;
      applied += 1;
      Atomics.store(this.control, READ, read);
    }
    return applied;
  }

  /** A call that came by message: the ring's calls before it, it, then those after it. */
  message([, n, call, handle]: NumberedCall): void {
    this.drain();
    if (n !== this.expected) return; // cannot be: a page numbers its calls in order
    if (call === null) {
      this.expected += 1;
      this.drain();
      return;
    }
    if (handle !== 0) {
      if (lastOfStream(call)) this.names.delete(handle);
      else this.names.set(handle, call[1]);
    }
    this.expected += 1;
    this.apply(call);
    this.drain();
  }

  /** Say this worker sleeps until woken: false (it stays awake) if calls came meanwhile. */
  sleep(): boolean {
    Atomics.store(this.control, SLEEPING, 1);
    if (Atomics.load(this.control, WRITE) === Atomics.load(this.control, READ)) return true;
    // Calls came: awake again, unless the page already took the wake (then its message comes).
    Atomics.compareExchange(this.control, SLEEPING, 1, 0);
    return false;
  }

  private take(at: number): void {
    const slots = this.slots;
    const given = slots[at + 8] as number;
    const handle = slots[at + 1] as number;
    const stream = this.names.get(handle) ?? "";
    const value = (bit: number, offset: number): number | undefined => ((given & bit) !== 0 ? slots[at + offset] : undefined);
    const final = (given & FINAL) !== 0 ? true : (given & NOT_FINAL) !== 0 ? false : undefined;
    const call: Call = [
      CHUNK, stream, slots[at + 2] as number, slots[at + 3] as number, value(AUDIO_MS, 4),
      value(PCM_BYTES, 5), undefined, value(ETA_MS, 6), final, value(PLAY_START_MS, 7),
    ];
    if (final === true) this.names.delete(handle);
    this.expected += 1;
    this.apply(call);
  }
}
