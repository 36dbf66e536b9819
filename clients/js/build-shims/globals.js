// Node's globals that mqtt.js and its streams use, injected where they are used: `process`
// (the `process` package's browser version, a dependency of readable-stream) and `global`.
import process from "process/browser.js";

export { process };
export const global = globalThis;
