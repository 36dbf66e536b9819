// mqtt.js imports worker-timers for its keep-alive in background tabs; the Reporter asks for
// native timers (`timerVariant: "native"`: a tab that plays audio is not throttled), so the
// bundle carries the browser's own.
export const setInterval = (fn, ms) => globalThis.setInterval(fn, ms);
export const clearInterval = (id) => globalThis.clearInterval(id);
export const setTimeout = (fn, ms) => globalThis.setTimeout(fn, ms);
export const clearTimeout = (id) => globalThis.clearTimeout(id);
