/** edgemon-reporter: report when each audio chunk reached a web player to edgemon. */
export { Reporter, type ReporterOptions, type ReporterStats } from "./reporter.js";
export { type ChunkOptions, type StartOptions } from "./events.js";
export { WebAudioStream, type WebAudioStreamOptions, type WebAudioStats } from "./webaudio.js";
export { MediaElementStream, type MediaStreamOptions, type MediaStats } from "./media.js";
export { Timeline } from "./timeline.js";
