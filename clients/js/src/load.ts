/**
 * Where the Reporter's worker and its in-page fallback come from: `worker.js` next to this
 * module. Written as bundlers recognise a worker (`new Worker(new URL("./worker.js",
 * import.meta.url), { type: "module" })`: Vite, webpack 5 and Parcel bundle worker.js, the
 * MQTT client with it, as a worker of its own; esbuild needs a plugin). The browser bundle replaces this
 * module (build.mjs: build-shims/load.js, the worker bundle next to the page's).
 */

const OPTIONS: WorkerOptions = { type: "module", name: "edgemon-reporter" };

/** A module worker running worker.js (or the one at `url`). Throws as `new Worker` does. */
export function startWorker(url?: string | URL): Worker {
  if (url !== undefined) return new Worker(url, OPTIONS);
  return new Worker(new URL("./worker.js", import.meta.url), { type: "module", name: "edgemon-reporter" });
}

/** worker.js imported into the page: the core, for a page that cannot start the worker. */
export function loadCore(): Promise<typeof import("./worker.js")> {
  return import("./worker.js");
}
