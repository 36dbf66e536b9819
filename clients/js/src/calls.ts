/**
 * A Reporter call once the page has stamped it: what the page's `Reporter` hands to its core,
 * across a `postMessage` to the worker or directly in the page, and what it holds while no
 * core is ready yet. Plain arrays of plain data (structured clone keeps them as they are):
 * `[0, stream, tMs, ...options]` a start, `[1, stream, tMs, now, ...options]` a chunk, `[2,
 * stream, tMs, reason]` an end. The options are read when the call is made, each field into
 * its place (the page may reuse its object; only the fields the Reporter reads cross; a flat
 * array is what costs the page's main thread least to post).
 */

import type { ReporterCore } from "./core.js";
import type { ChunkOptions, StartOptions } from "./events.js";

export type Call =
  | [kind: 0, stream: string, tMs: number, playStartMs: unknown, marginMs: unknown, player: unknown, audioFormat: unknown]
  | [kind: 1, stream: string, tMs: number, now: number, audioMs: unknown, pcmBytes: unknown, audioFormat: unknown, etaMs: unknown, final: unknown, playStartMs: unknown]
  | [kind: 2, stream: string, tMs: number, reason: string];

/** Kinds of call, as they are numbered in a `Call`. */
export const START = 0;
export const CHUNK = 1;
export const END = 2;

export function startCall(stream: string, tMs: number, o: StartOptions): Call {
  return [START, stream, tMs, o.playStartMs, o.marginMs, o.player, o.audioFormat];
}

export function chunkCall(stream: string, tMs: number, now: number, o: ChunkOptions): Call {
  return [CHUNK, stream, tMs, now, o.audioMs, o.pcmBytes, o.audioFormat, o.etaMs, o.final, o.playStartMs];
}

export function endCall(stream: string, tMs: number, reason: string): Call {
  return [END, stream, tMs, reason];
}

/** The options object of a call's fields: those given (`undefined` is not given). */
function options<T>(names: readonly string[], values: readonly unknown[], from: number): T {
  const out: Record<string, unknown> = {};
  for (let i = 0; i < names.length; i += 1) {
    const value = values[from + i];
    if (value !== undefined) out[names[i] as string] = value;
  }
  return out as T;
}

const START_FIELDS = ["playStartMs", "marginMs", "player", "audioFormat"];
const CHUNK_FIELDS = ["audioMs", "pcmBytes", "audioFormat", "etaMs", "final", "playStartMs"];

/** Make `call` on `core` (which never throws). */
export function applyCall(core: ReporterCore, call: Call): void {
  switch (call[0]) {
    case START:
      core.start(call[1], call[2], options<StartOptions>(START_FIELDS, call, 3));
      break;
    case CHUNK:
      core.chunk(call[1], call[2], call[3], options<ChunkOptions>(CHUNK_FIELDS, call, 4));
      break;
    case END:
      core.end(call[1], call[2], call[3]);
      break;
    default:
      break;
  }
}
