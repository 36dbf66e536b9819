/**
 * The Reporter's Web Worker: the `ReporterCore` (the events, the batching, the MQTT client
 * and the WebSocket) runs here, off the page's main thread, which only stamps each call and
 * hands it over (reporter.ts, sinks.ts, handoff.ts). The same module is the page's fallback: where no worker can start (a Content
 * Security Policy, a bundle served from another origin), the page imports it and runs the
 * core itself; it starts a worker's host only inside a worker.
 *
 * The messages, page to worker: `["init", url, settings, ring]` once (`ring`: the shared
 * buffer of handoff.ts, or null), then calls (calls.ts) one by one or as `["calls", [...]]`
 * (with a ring: numbered, `["call", n, call, handle]`, and `["wake"]` when the worker slept),
 * `["open"]`, `["flush", id, timeoutMs]`, `["close", id, timeoutMs]`, `["stats"]`. Worker to
 * page: `["ready"]` when this module has loaded (the page
 * sends nothing but `init` and the calls it held until then, so a worker that never loads has
 * sent nothing), `["log", message]`, `["state", stats]` when the connection changed,
 * `["stats", stats]`, `["flushed", id, done, stats]`, `["closed", id, stats]`.
 */

import { applyCall, type Call } from "./calls.js";
import { type CoreSettings, ReporterCore } from "./core.js";
import { IDLE_MS, type NumberedCall, POLL_MS, RingReader } from "./handoff.js";

export { ReporterCore } from "./core.js";

/** What this module uses of a worker's global scope. */
interface Scope {
  postMessage(message: unknown): void;
  onmessage: ((event: { data: unknown }) => void) | null;
}

type Message =
  | Call
  | [kind: "init", url: string, settings: CoreSettings, ring: SharedArrayBuffer | null]
  | NumberedCall
  | [kind: "wake"]
  | [kind: "calls", calls: Call[]]
  | [kind: "open"]
  | [kind: "flush", id: number, timeoutMs: number]
  | [kind: "close", id: number, timeoutMs: number]
  | [kind: "stats"];

/** Serve the page's Reporter from this worker (never throws: a failure is counted). */
export function host(scope: Scope): void {
  let core: ReporterCore | null = null;
  let ring: RingReader | null = null;
  let polling: ReturnType<typeof setTimeout> | undefined;
  let idleSince = 0;
  /** Read the ring every POLL_MS while calls come; sleep after IDLE_MS without any. */
  const poll = (): void => {
    polling = undefined;
    if (ring === null) return;
    const now = performance.now();
    try {
      if (ring.drain() > 0) idleSince = now;
      if (now - idleSince >= IDLE_MS && ring.sleep()) return;
    } catch (error) {
      core?.noteError(error);
    }
    polling = setTimeout(poll, POLL_MS);
  };
  const wake = (): void => {
    idleSince = performance.now();
    if (polling === undefined) poll();
  };
  const post = (message: unknown): void => {
    try {
      scope.postMessage(message);
    } catch (error) {
      core?.noteError(error);
    }
  };
  const handle = (message: Message): void => {
    if (typeof message[0] === "number") {
      if (core !== null) applyCall(core, message as Call);
      return;
    }
    if (message[0] === "init") {
      const made: ReporterCore = new ReporterCore(
        message[1], message[2], () => performance.now(),
        (text) => post(["log", text]), () => post(["state", made.stats]),
      );
      core = made;
      if (message[3] !== null) {
        ring = new RingReader(message[3], (call) => applyCall(made, call));
        wake();
      }
      return;
    }
    const ready = core;
    if (ready === null) return;
    if (message[0] === "call") {
      ring?.message(message);
      return;
    }
    ring?.drain(); // every call made before this message first
    switch (message[0]) {
      case "calls":
        for (const call of message[1]) applyCall(ready, call);
        break;
      case "open":
        ready.open();
        break;
      case "flush": {
        const id = message[1];
        void ready.flush(message[2]).then((done) => post(["flushed", id, done, ready.stats]));
        break;
      }
      case "close": {
        const id = message[1];
        clearTimeout(polling);
        ring = null;
        void ready.close(message[2]).then(() => post(["closed", id, ready.stats]));
        break;
      }
      case "stats":
        post(["stats", ready.stats]);
        break;
      case "wake":
        wake();
        break;
      default:
        break;
    }
  };
  scope.onmessage = (event) => {
    try {
      handle(event.data as Message);
    } catch (error) {
      core?.noteError(error);
    }
  };
  post(["ready"]);
}

const WorkerScope = (globalThis as { WorkerGlobalScope?: abstract new () => unknown }).WorkerGlobalScope;
if (typeof WorkerScope === "function" && globalThis instanceof WorkerScope) {
  host(globalThis as unknown as Scope);
}
