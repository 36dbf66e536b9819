// `process` for mqtt.js and readable-stream in the page: nextTick is a microtask (the `process`
// package's browser version defers through setTimeout: a task, and a timer, for each packet
// written, which cost the page several times the Reporter's own work).
module.exports = {
  nextTick: (callback, ...args) => queueMicrotask(() => callback(...args)),
  env: {},
  browser: true,
  version: "",
  versions: {},
  argv: [],
  platform: "browser",
  emitWarning: () => {},
};
