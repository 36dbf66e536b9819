// The browser bundles, minified ES modules: the page's (dist/edgemon-reporter.min.js: the
// Reporter's page side and the hooks) and its worker's (dist/edgemon-reporter-worker.min.js:
// the core and its MQTT link, mqtt.ts). The page's bundle starts the worker from the file next
// to it, or imports it into the page where no worker can start (build-shims/load.js).
import { build } from "esbuild";

const shims = new URL("./build-shims/", import.meta.url).pathname;
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
      // The page's side imports the core for its types only: the link must not come in.
      b.onResolve({ filter: /\/(core|mqtt)\.js$/ }, (args) => ({ errors: [{ text: `${args.path} in the page's bundle` }] }));
    },
  }],
});
const worker = build({
  ...common,
  entryPoints: ["dist/worker.js"],
  outfile: "dist/edgemon-reporter-worker.min.js",
  // The worker logs through the page (postMessage), never through its console.
  drop: ["console", "debugger"],
});
// `node build.mjs --analyze` (`npm run size`): each file's bytes by the module they come from
// (what no input accounts for: esbuild's module wrappers and the license comments).
const analyze = process.argv.includes("--analyze");
for (const result of await Promise.all([page, worker])) {
  for (const [file, output] of Object.entries(result.metafile.outputs)) {
    console.log(`${file}: ${output.bytes} bytes`);
    if (!analyze) continue;
    const bytes = Object.entries(output.inputs).map(([path, input]) => [path, input.bytesInOutput]);
    const counted = bytes.reduce((sum, [, size]) => sum + size, 0);
    bytes.push(["(wrappers, license comments)", output.bytes - counted]);
    for (const [name, size] of bytes.sort((a, b) => b[1] - a[1])) {
      console.log(`  ${(size / 1000).toFixed(1).padStart(6)} kB  ${name}`);
    }
  }
}
