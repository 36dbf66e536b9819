// The browser bundle: dist/edgemon-reporter.min.js, one minified ES module with mqtt.js in it
// (its client and WebSocket transport only; build-shims/ says what replaces what).
import { build } from "esbuild";

const shims = new URL("./build-shims/", import.meta.url).pathname;
const result = await build({
  entryPoints: ["dist/index.js"],
  bundle: true,
  minify: process.env.NOMIN ? false : true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  outfile: "dist/edgemon-reporter.min.js",
  // The bare `mqtt` the Reporter imports becomes the WebSocket-only client (its subpaths stay);
  // `process` (readable-stream asks for "process/") the page's own (build-shims/process.cjs).
  plugins: [{
    name: "mqtt-ws",
    setup(b) {
      b.onResolve({ filter: /^mqtt$/ }, () => ({ path: `${shims}mqtt-ws.js` }));
      b.onResolve({ filter: /^process\/?$/ }, () => ({ path: `${shims}process.cjs` }));
    },
  }],
  alias: {
    debug: `${shims}debug.cjs`,
    "worker-timers": `${shims}worker-timers.js`,
    "lru-cache": `${shims}lru-cache.js`,
  },
  inject: [`${shims}globals.js`],
  define: { "process.env.NODE_ENV": '"production"' },
  legalComments: "eof",
  metafile: true,
});
const [output] = Object.values(result.metafile.outputs);
console.log(`dist/edgemon-reporter.min.js: ${output.bytes} bytes`);
