/**
 * Where a page's `Reporter` sends its calls: `PageSink`, the core in the page itself, or
 * `WorkerSink`, the core in the Reporter's Web Worker (worker.ts), each call handed over by a
 * `postMessage` or, on a cross-origin isolated page, through shared memory (handoff.ts).
 */

import { applyCall, type Call } from "./calls.js";
import type { CoreStats, ReporterCore } from "./core.js";
import type { RingWriter } from "./handoff.js";

/** How much longer than its own timeout a reply from the worker may take (ms). */
const REPLY_GRACE_MS = 2_000;

export const EMPTY: CoreStats = {
  events: 0, sent: 0, messages: 0, dropped: 0, buffered: 0, inFlight: 0, connected: false,
  connects: 0, connectErrors: 0, merged: 0, conflicts: {}, invalid: 0, errors: 0,
};

/** The core the calls go to: in the Reporter's worker, or in the page. */
export interface Sink {
  readonly worker: boolean;
  call(call: Call): void;
  open(): void;
  flush(timeoutMs: number): Promise<boolean>;
  close(timeoutMs: number): Promise<void>;
  stats(): CoreStats;
}

export class PageSink implements Sink {
  readonly worker = false;
  constructor(private readonly core: ReporterCore) {}
  call(call: Call): void {
    applyCall(this.core, call);
  }
  open(): void {
    this.core.open();
  }
  flush(timeoutMs: number): Promise<boolean> {
    return this.core.flush(timeoutMs);
  }
  close(timeoutMs: number): Promise<void> {
    return this.core.close(timeoutMs);
  }
  stats(): CoreStats {
    return this.core.stats;
  }
}

export type Reply = [kind: string, id: number, ...rest: unknown[]];

export class WorkerSink implements Sink {
  readonly worker = true;
  latest: CoreStats = EMPTY;
  private asked = false;
  private ended = false;
  private nextId = 0;
  private readonly replies = new Map<number, (reply: Reply | null) => void>();
  /** With `handoffMs`, the calls not yet posted: those made within it go in one message. */
  private outbox: Call[] = [];

  /** `refused(error)`: a call that could not be posted (an argument the structured clone
   * cannot copy); `ring`: the shared memory the calls go through where they can (the
   * `handoffMs` window is then 0). */
  constructor(
    private readonly port: Worker,
    private readonly handoffMs: number,
    private readonly refused: (error: unknown) => void,
    private readonly ring: RingWriter | null = null,
  ) {}

  /** Whether the calls go through shared memory. */
  get shared(): boolean {
    return this.ring !== null;
  }

  call(call: Call): void {
    if (this.ring !== null) {
      if (this.ended) return;
      const message = this.ring.hand(call);
      try {
        if (message === null) {
          if (this.ring.wake()) this.port.postMessage(["wake"]);
        } else {
          this.port.postMessage(message);
        }
      } catch (error) {
        if (message !== null) this.port.postMessage(this.ring.refused(message));
        this.refused(error);
      }
      return;
    }
    if (this.handoffMs === 0) {
      // At once, in the caller's task. Most of a message's cost to the page is waking the
      // worker, paid once a task: the calls after the first in one task add about what a
      // microtask gathering them would cost, and an isolated call saves the microtask
      // (measured: docs/how-to/web-player.md, "What was measured").
      if (this.ended) return;
      try {
        this.port.postMessage(call);
      } catch (error) {
        this.refused(error);
      }
      return;
    }
    this.outbox.push(call);
    if (this.outbox.length === 1) setTimeout(this.handoff, this.handoffMs);
  }
  /** The calls made before the worker was ready, in order. */
  deliverHeld(calls: Call[]): void {
    if (calls.length === 0) return;
    if (this.ring !== null) for (const call of calls) this.call(call);
    else this.post(["calls", calls]);
  }
  post(message: unknown): void {
    this.handoff();
    if (!this.ended) this.port.postMessage(message);
  }
  open(): void {
    this.post(["open"]);
  }
  async flush(timeoutMs: number): Promise<boolean> {
    const reply = await this.request("flush", timeoutMs);
    return reply !== null && reply[2] === true;
  }
  async close(timeoutMs: number): Promise<void> {
    await this.request("close", timeoutMs);
    this.ended = true;
    this.port.terminate();
  }
  /** Post the calls waiting (never throws: a call that cannot be posted is refused). */
  private readonly handoff = (): void => {
    const calls = this.outbox;
    if (calls.length === 0 || this.ended) return;
    this.outbox = [];
    try {
      this.port.postMessage(calls.length === 1 ? calls[0] : ["calls", calls]);
    } catch {
      for (const call of calls) {
        try {
          this.port.postMessage(call);
        } catch (error) {
          this.refused(error);
        }
      }
    }
  };
  /** The worker's stats as last heard; asks it for fresh ones (never throws). */
  stats(): CoreStats {
    if (!this.asked && !this.ended) {
      this.asked = true;
      try {
        this.post(["stats"]);
      } catch {
        this.asked = false;
      }
    }
    return this.latest;
  }
  /** A message from the worker. */
  received(message: Reply): void {
    const [kind] = message;
    if (kind === "stats" || kind === "state") {
      this.latest = message[1] as unknown as CoreStats;
      if (kind === "stats") this.asked = false;
      return;
    }
    this.latest = message[message.length - 1] as CoreStats;
    this.replies.get(message[1])?.(message);
  }
  private request(kind: string, timeoutMs: number): Promise<Reply | null> {
    const id = this.nextId++;
    return new Promise((resolve) => {
      const timer = setTimeout(() => done(null), timeoutMs + REPLY_GRACE_MS);
      const done = (reply: Reply | null): void => {
        clearTimeout(timer);
        this.replies.delete(id);
        resolve(reply);
      };
      this.replies.set(id, done);
      try {
        this.post([kind, id, timeoutMs]);
      } catch {
        done(null);
      }
    });
  }
}
