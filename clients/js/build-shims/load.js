// The browser bundle's load.js: the worker is the worker bundle next to the page's bundle
// (dist/edgemon-reporter-worker.min.js, the core and its MQTT link), and so is the in-page
// fallback.
const file = new URL("./edgemon-reporter-worker.min.js", import.meta.url);
const options = { type: "module", name: "edgemon-reporter" };

export function startWorker(url) {
  return new Worker(url ?? file, options);
}

export function loadCore() {
  return import(file.href);
}
