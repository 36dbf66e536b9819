// The browser bundles, minified ES modules: the page's (dist/edgemon-reporter.min.js: the
// Reporter's page side and the hooks) and its worker's (dist/edgemon-reporter-worker.min.js:
// the core, with mqtt.js's client and WebSocket transport). The page's bundle starts the
// worker from the file next to it, or imports it into the page where no worker can start
// (build-shims/load.js). build-shims/ says what stands in for what in mqtt.js's dependencies;
// what each saves (minified): mqtt's package.json read for its version alone 3.7 kB, bl's
// BufferList 1.4 kB, process-nextick-args 0.6 kB, string_decoder 3.4 kB, console and
// debugger statements dropped from the worker 0.3 kB. (readable-stream's four classes without
// its entry module would save 14.6 kB more, but the classes read two functions that entry
// sets on their base class, `Stream._isUint8Array` and `_uint8ArrayToBuffer`: not done.)
import { readFileSync } from "node:fs";

import { build } from "esbuild";

const shims = new URL("./build-shims/", import.meta.url).pathname;
const mqttVersion = JSON.parse(readFileSync("node_modules/mqtt/package.json", "utf8")).version;
const common = {
  bundle: true,
  minify: process.env.NOMIN ? false : true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  legalComments: "eof",
  metafile: true,
};
const page = build({
  ...common,
  entryPoints: ["dist/index.js"],
  outfile: "dist/edgemon-reporter.min.js",
  plugins: [{
    name: "worker-file",
    setup(b) {
      b.onResolve({ filter: /\/load\.js$/ }, () => ({ path: `${shims}load.js` }));
      // The page's side imports the core for its types only: mqtt.js must not come in.
      b.onResolve({ filter: /^mqtt$/ }, () => ({ errors: [{ text: "mqtt.js in the page's bundle" }] }));
    },
  }],
});
const worker = build({
  ...common,
  entryPoints: ["dist/worker.js"],
  outfile: "dist/edgemon-reporter-worker.min.js",
  // The worker logs through the page (postMessage), never through its console.
  drop: ["console", "debugger"],
  plugins: [{
    name: "mqtt-ws",
    setup(b) {
      // The bare `mqtt` the core imports becomes the WebSocket-only client (its subpaths
      // stay); `process` (readable-stream asks for "process/") the page's own.
      b.onResolve({ filter: /^mqtt$/ }, () => ({ path: `${shims}mqtt-ws.js` }));
      b.onResolve({ filter: /^process\/?$/ }, () => ({ path: `${shims}process.cjs` }));
      b.onResolve({ filter: /^bl$/ }, () => ({ path: `${shims}bl.cjs` }));
      b.onResolve({ filter: /^string_decoder\/?$/ }, () => ({ path: `${shims}string_decoder.cjs` }));
      // mqtt.js reads its whole package.json for its version (MQTTJS_VERSION).
      b.onResolve({ filter: /package\.json$/ }, (args) => (
        args.importer.includes("/node_modules/mqtt/") ? { path: "mqtt-version", namespace: "mqtt-version" } : undefined
      ));
      b.onLoad({ filter: /.*/, namespace: "mqtt-version" }, () => ({
        contents: JSON.stringify({ version: mqttVersion }), loader: "json",
      }));
    },
  }],
  alias: {
    debug: `${shims}debug.cjs`,
    "worker-timers": `${shims}worker-timers.js`,
    "lru-cache": `${shims}lru-cache.js`,
    "process-nextick-args": `${shims}nextick.cjs`,
  },
  inject: [`${shims}globals.js`],
  define: { "process.env.NODE_ENV": '"production"' },
});
// `node build.mjs --analyze` (`npm run size`): each file's bytes by the package they come
// from (the Reporter's own: dist/ and build-shims/, mqtt.js's version string under mqtt; what
// no input accounts for: esbuild's module wrappers and the license comments).
const analyze = process.argv.includes("--analyze");
function origin(path) {
  const pkg = /node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(path);
  if (pkg) return pkg[1];
  if (path.startsWith("dist/")) return "the Reporter (dist/)";
  return path.startsWith("mqtt-version") ? "mqtt" : "build-shims/";
}
for (const result of await Promise.all([page, worker])) {
  for (const [file, output] of Object.entries(result.metafile.outputs)) {
    console.log(`${file}: ${output.bytes} bytes`);
    if (!analyze) continue;
    const bytes = new Map();
    for (const [path, input] of Object.entries(output.inputs)) {
      bytes.set(origin(path), (bytes.get(origin(path)) ?? 0) + input.bytesInOutput);
    }
    const counted = [...bytes.values()].reduce((a, b) => a + b, 0);
    bytes.set("(wrappers, license comments)", output.bytes - counted);
    for (const [name, size] of [...bytes].sort((a, b) => b[1] - a[1])) {
      console.log(`  ${(size / 1000).toFixed(1).padStart(6)} kB  ${name}`);
    }
  }
}
