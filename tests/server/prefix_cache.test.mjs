// The disk prefix cache (--prefix-cache with --slot-save-path): a slot's cache goes to disk
// when another request takes the slot; a request sharing its long prefix later (in the same
// process, or a new one) starts from the file and answers as it did cold. The files stay
// within their size; short prefixes are not saved.
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { startServer, metric } from "./lib.mjs";

const DOC = "The jury said that the city of Atlanta should take steps to improve its election laws. " +
  "The grand jury commented on a number of other topics, among them the purchasing departments of the city, " +
  "which it said were well operated and followed generally accepted practices. It recommended that the " +
  "county and the city should share the cost of the new jail, and that the legislature act on the matter. ";
const ask = (q) => ({ model: "demo", prompt: DOC + q, max_tokens: 10, temperature: 0 });
const files = (dir) => fs.readdirSync(dir).filter((f) => f.startsWith("prefix-") && f.endsWith(".kvqs"));

async function run(args, fn) {
  const srv = await startServer(args);
  try {
    await fn(srv, new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 }));
  } finally {
    assert.equal(await srv.stop(), 0);
  }
}

test("evicted to disk, restored for a new request, in this process and the next", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kvq-prefix-"));
  const args = ["-np", "1", "-c", "512", "--slot-save-path", dir, "--prefix-cache", "64"];
  let cold;
  await run(["-np", "1", "-c", "512"], async (srv, client) => { cold = await client.completions.create(ask("The jury")); });
  await run(args, async (srv, client) => {
    const first = await client.completions.create(ask("The jury"));
    assert.equal(first.choices[0].text, cold.choices[0].text);
    assert.equal(files(dir).length, 0, "nothing evicted yet");
    await client.completions.create({ model: "demo", prompt: "It was a cold morning in the mountains", max_tokens: 4, temperature: 0 });
    assert.equal(files(dir).length, 1, "the document's cache went to disk when the slot was taken");
    assert.equal(await metric(srv.url, "prefix_cache_saves_total"), 1);
    const warm = await client.completions.create(ask("The jury"));
    assert.equal(warm.choices[0].text, cold.choices[0].text, "restored: the cold greedy reply");
    assert.ok(warm.timings.cache_disk_n >= cold.usage.prompt_tokens - 4, `from disk: ${warm.timings.cache_disk_n}`);
    assert.equal(warm.usage.prompt_tokens_details.cached_tokens, warm.timings.cache_disk_n);
    assert.equal(await metric(srv.url, "prefix_cache_hits_total"), 1);
  });
  await run(args, async (srv, client) => {
    assert.equal(await metric(srv.url, "prefix_cache_files"), 1, "a new process finds the file");
    const other = await client.completions.create(ask("The grand jury"));
    assert.ok(other.timings.cache_disk_n > 50, "another question on the same document starts from it");
    const again = await client.completions.create(ask("The jury"));
    assert.equal(again.choices[0].text, cold.choices[0].text);
  });
});

test("the files stay within --prefix-cache; short prompts are not saved", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kvq-prefix-"));
  await run(["-np", "1", "-c", "512", "--slot-save-path", dir, "--prefix-cache", "1"], async (srv, client) => {
    for (const w of ["One", "Two", "Three", "Four", "Five"])
      await client.completions.create({ model: "demo", prompt: w + " " + DOC, max_tokens: 2, temperature: 0 });
    const bytes = files(dir).reduce((s, f) => s + fs.statSync(path.join(dir, f)).size, 0);
    assert.ok(files(dir).length >= 1 && bytes <= 1 << 20, `${files(dir).length} files, ${bytes} bytes`);
    assert.equal(await metric(srv.url, "prefix_cache_bytes"), bytes);
    assert.equal(await metric(srv.url, "prefix_cache_saves_total"), 4, "each document but the last was evicted");
    const n = files(dir).length;
    for (const w of ["Hi", "Yes"]) await client.completions.create({ model: "demo", prompt: w, max_tokens: 2, temperature: 0 });
    assert.equal(await metric(srv.url, "prefix_cache_saves_total"), 5, "the last document, evicted by the first short prompt");
    assert.ok(files(dir).length <= n + 1);
  });
});
