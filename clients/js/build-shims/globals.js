// Node's globals that mqtt.js and readable-stream use, injected where they are used.
import process from "./process.cjs";

export { process };
export const global = globalThis;
// mqtt.js's client uses the global Buffer for payloads that are not strings.
export { Buffer } from "buffer";
