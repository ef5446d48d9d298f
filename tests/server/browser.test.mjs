// Headless Chromium opens the chat page, sends a message and sees the reply
// stream in; the screenshot is kept in the build directory (CI artifact).
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import puppeteer from "puppeteer-core";
import { startServer, BUILD_DIR } from "./lib.mjs";

const CHROME = [process.env.CHROME_PATH, "/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"]
  .find((p) => p && fs.existsSync(p));

test("the chat page streams a reply", { skip: CHROME ? false : "no chromium (apt-get install chromium)" }, async () => {
  // 40 ms per step: a reply takes long enough to be seen arriving, and to be stopped
  const srv = await startServer(["-np", "2", "-c", "512"], { env: { KVQ_SERVER_STEP_MS: "40" } });
  const browser = await puppeteer.launch({
    executablePath: CHROME, headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
  });
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 900, height: 640 });
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(srv.url + "/", { waitUntil: "load" });
    await page.waitForFunction(() => document.getElementById("model").textContent.includes("demo"));
    // greedy, so the reply is the same each run
    await page.evaluate(() => {
      localStorage.setItem("kvq-chat", JSON.stringify({ messages: [], settings: { temperature: 0, max_tokens: 200 } }));
    });
    await page.reload({ waitUntil: "load" });
    // count how often the reply's text changes: a streamed reply grows piece by piece
    await page.evaluate(() => {
      window.kvqUpdates = 0;
      new MutationObserver(() => {
        const b = document.querySelector(".assistant .bubble");
        if (b && b.textContent !== window.kvqLast) { window.kvqLast = b.textContent; window.kvqUpdates++; }
      }).observe(document.getElementById("log"), { childList: true, subtree: true, characterData: true });
    });
    await page.type("#input", "The jury said");
    await page.keyboard.press("Enter");
    await page.waitForFunction(() => document.querySelector(".assistant .meta")?.textContent.includes("tok/s"), { timeout: 60000 });
    const updates = await page.evaluate(() => window.kvqUpdates);
    assert.ok(updates >= 3, "the reply arrived in pieces: " + updates + " updates");
    const reply = await page.$eval(".assistant .bubble", (e) => e.textContent);
    const meta = await page.$eval(".assistant .meta", (e) => e.textContent);
    assert.ok(reply.length > 0, "a reply");
    assert.match(meta, /\d+ tokens, [\d.]+ tok\/s/);
    const shot = path.join(BUILD_DIR, "kvq-server-ui.png");
    await page.screenshot({ path: shot });
    assert.ok(fs.statSync(shot).size > 1000, "screenshot saved: " + shot);
    // the conversation stays in the browser
    await page.reload({ waitUntil: "load" });
    const kept = await page.$$eval(".msg", (els) => els.map((e) => e.textContent));
    assert.equal(kept.length, 2);
    assert.ok(kept[0].includes("The jury said"));
    // stop: the button cuts a reply mid-way
    await page.type("#input", "The jury said");
    await page.click("#send");
    await page.waitForFunction(() => document.body.dataset.busy === "1");
    await page.waitForFunction(() => (document.querySelectorAll(".assistant .bubble")[1]?.textContent || "").length > 0, { timeout: 60000 });
    await page.click("#stop");
    await page.waitForFunction(() => document.querySelectorAll(".assistant .meta")[1]?.textContent.includes("stopped"), { timeout: 10000 });
    assert.equal(await page.evaluate(() => document.body.dataset.busy), "");
    assert.deepEqual(errors, []);
  } finally {
    await browser.close();
    assert.equal(await srv.stop(), 0);
  }
});
