/** The wire contract's names and limits (docs/protocol.md; `edgemon/protocol.py`). */

export const TOPIC_PREFIX = "edgemon/v1";
export const RESERVED_DEVICE = "_edgemon";
export const DEVICE_ID = /^[A-Za-z0-9._-]{1,64}$/;
export const STREAM_ID = /^[A-Za-z0-9._:-]{1,128}$/;
export const PLAYERS: ReadonlySet<string> = new Set(["conceal", "rebuffer"]);
export const MAX_TIME_MS = 2 ** 53;
export const MAX_AUDIO_MS = 600_000;
export const MAX_ETA_MS = 3_600_000;
export const MAX_MARGIN_MS = 60_000;
export const MAX_REASON = 64;
/** edgemon's default `[limits]`: a batch within both is never refused for its size. */
export const MAX_BATCH_EVENTS = 1_000;
export const MAX_PAYLOAD_BYTES = 262_144;
export const MAX_STREAMS_PER_DEVICE = 256;

/** A bad argument: the Python client raises ValueError; this one counts it and drops the call. */
export class InvalidArgument extends Error {}

/** What keeps `prefix` from being the topic prefix, or null. */
export function topicPrefixProblem(prefix: unknown): string | null {
  if (typeof prefix !== "string" || prefix === "" || prefix.split("/").includes("")) {
    return "must be MQTT topic levels separated by '/', none of them empty";
  }
  if (prefix.includes("+") || prefix.includes("#") || prefix.includes("\u0000")) {
    return "must not contain the wildcards '+' or '#'";
  }
  if (prefix.startsWith("$")) return "must not start with '$' (reserved by brokers)";
  return null;
}

/** Whether `device` can name a device: the pattern, and not the reserved `_edgemon`. */
export function validDeviceId(device: unknown): device is string {
  return typeof device === "string" && DEVICE_ID.test(device) && device !== RESERVED_DEVICE;
}
