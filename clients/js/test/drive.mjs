// Drives the test player in Debian's headless Chromium with puppeteer-core:
//   node drive.mjs URL OUT.json [--timeout-s N]
// Opens URL (the test server's page), waits for `window.__result`, and writes
// {"result": ..., "phases": {name: metrics}, "console": [...]} to OUT.json, where `phases` are
// Chrome's own performance metrics (CDP Performance.getMetrics: ScriptDuration, TaskDuration,
// … in seconds) taken when the page calls `window.phase(name)`.
// Chromium: --autoplay-policy=no-user-gesture-required (audio without a click); headless has
// no sound card and plays into a fake output device; certificates of the test's own CA are
// accepted (the broker's wss:// listener).
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import puppeteer from "puppeteer-core";

const [url, out, ...rest] = process.argv.slice(2);
const timeoutS = Number(rest[rest.indexOf("--timeout-s") + 1] ?? 120) || 120;
const chromium = process.env.CHROMIUM ?? "/usr/bin/chromium";
const profile = mkdtempSync(join(tmpdir(), "edgemon-chromium-"));
const consoleLines = [];
const phases = {};

const browser = await puppeteer.launch({
  executablePath: chromium,
  headless: true,
  acceptInsecureCerts: true,
  args: [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    `--user-data-dir=${profile}`, "--autoplay-policy=no-user-gesture-required",
    "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
    "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
  ],
});
let code = 0;
try {
  const page = await browser.newPage();
  const cdp = await page.createCDPSession();
  await cdp.send("Performance.enable", { timeDomain: "threadTicks" });
  page.on("console", (message) => consoleLines.push(`${message.type()}: ${message.text()}`));
  let failed;
  const pageFailed = new Promise((_, reject) => { failed = reject; });
  pageFailed.catch(() => {}); // raced below; never unhandled
  page.on("pageerror", (error) => {
    consoleLines.push(`pageerror: ${error.message}`);
    failed(new Error(`the page threw: ${error.message}`));
  });
  await page.exposeFunction("phase", async (name) => {
    const { metrics } = await cdp.send("Performance.getMetrics");
    phases[name] = Object.fromEntries(metrics.map((m) => [m.name, m.value]));
  });
  await page.goto(url, { waitUntil: "load" });
  await Promise.race([
    page.waitForFunction(() => window.__result !== undefined, { timeout: timeoutS * 1000, polling: 100 }),
    pageFailed,
  ]);
  const result = await page.evaluate(() => window.__result);
  writeFileSync(out, JSON.stringify({ result, phases, console: consoleLines }));
} catch (error) {
  writeFileSync(out, JSON.stringify({ result: { error: `${error?.stack ?? error}` }, phases, console: consoleLines }));
  code = 1;
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
process.exit(code);
