// Slots' KV caches on disk: POST /slots/{id}?action=save|restore|erase under --slot-save-path.
// For every cache type a restored slot (after an erase, and in a new server process) takes the
// prompt from the cache and continues exactly as before; bad names, missing and damaged files
// are clear errors; without --slot-save-path save and restore are 501.
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { startServer, postJSON } from "./lib.mjs";

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kvq-slots-"));
const prompt = "The jury said that the city of Atlanta should take steps to improve its election laws, and the grand jury";
const slotURL = (srv, id, action) => `${srv.url}/slots/${id}?action=${action}`;

async function complete(srv) {
  const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
  return client.completions.create({ model: "demo", prompt, max_tokens: 12, temperature: 0 });
}

for (const type of ["f32", "f16", "q8", "q4"]) {
  test(`save, erase, restore and a new process: ${type} cache`, async () => {
    const args = ["-np", "1", "-c", "256", "-ctk", type, "-ctv", type, "--slot-save-path", dir];
    let srv = await startServer(args), want;
    try {
      const first = await complete(srv);
      want = first.choices[0].text;
      const save = await postJSON(slotURL(srv, 0, "save"), { filename: `s-${type}.bin` });
      assert.equal(save.status, 200, save.text);
      assert.equal(save.json.id_slot, 0);
      assert.ok(save.json.n_saved > first.usage.prompt_tokens, "prompt and reply were saved");
      assert.equal(save.json.n_written, fs.statSync(path.join(dir, `s-${type}.bin`)).size);
      const erase = await postJSON(slotURL(srv, 0, "erase"), "");
      assert.equal(erase.status, 200, erase.text);
      assert.equal(erase.json.n_erased, save.json.n_saved);
      const cold = await complete(srv);
      assert.equal(cold.usage.prompt_tokens_details.cached_tokens, 0, "erased: nothing cached");
      const restore = await postJSON(slotURL(srv, 0, "restore"), { filename: `s-${type}.bin` });
      assert.equal(restore.status, 200, restore.text);
      assert.equal(restore.json.n_restored, save.json.n_saved);
      const warm = await complete(srv);
      assert.equal(warm.choices[0].text, first.choices[0].text, "restored: the same greedy continuation");
      assert.equal(warm.usage.prompt_tokens_details.cached_tokens, warm.usage.prompt_tokens - 1);
    } finally {
      assert.equal(await srv.stop(), 0);
    }
    srv = await startServer(args);
    try {
      const restore = await postJSON(slotURL(srv, 0, "restore"), { filename: `s-${type}.bin` });
      assert.equal(restore.status, 200, restore.text);
      const again = await complete(srv);
      assert.equal(again.usage.prompt_tokens_details.cached_tokens, again.usage.prompt_tokens - 1);
      assert.equal(again.choices[0].text, want, "a new process continues from the file the same way");
    } finally {
      assert.equal(await srv.stop(), 0);
    }
  });
}

test("file sizes follow the cache type", () => {
  const size = (t) => fs.statSync(path.join(dir, `s-${t}.bin`)).size;
  assert.ok(size("f16") < 0.52 * size("f32"));
  assert.ok(size("q4") < 0.32 * size("f16"), `q4 ${size("q4")} vs f16 ${size("f16")}`);
});

test("bad requests", async () => {
  const srv = await startServer(["-np", "2", "-c", "256", "-ctk", "q4", "-ctv", "q4", "--slot-save-path", dir]);
  try {
    const bad = async (url, body, status, words) => {
      const r = await postJSON(url, body);
      assert.equal(r.status, status, `${url}: ${r.text}`);
      assert.equal(typeof r.json.error.message, "string");
      assert.ok(r.json.error.message.includes(words), `${url}: "${r.json.error.message}" lacks "${words}"`);
    };
    await bad(slotURL(srv, 0, "save"), { filename: "../escape.bin" }, 400, "filename");
    await bad(slotURL(srv, 0, "save"), { filename: ".hidden" }, 400, "filename");
    await bad(slotURL(srv, 0, "save"), {}, 400, "filename");
    await bad(slotURL(srv, 2, "save"), { filename: "x.bin" }, 400, "no slot 2");
    await bad(slotURL(srv, "x", "erase"), "", 400, "slot id");
    await bad(slotURL(srv, 0, "frobnicate"), "", 400, "want save, restore or erase");
    await bad(slotURL(srv, 0, "restore"), { filename: "missing.bin" }, 404, "missing.bin");
    fs.writeFileSync(path.join(dir, "junk.bin"), "not a session at all");
    await bad(slotURL(srv, 0, "restore"), { filename: "junk.bin" }, 400, "not a kvq session");
    const damaged = fs.readFileSync(path.join(dir, "s-q4.bin"));
    damaged[damaged.length >> 1] ^= 0x10;
    fs.writeFileSync(path.join(dir, "damaged.bin"), damaged);
    await bad(slotURL(srv, 1, "restore"), { filename: "damaged.bin" }, 400, "damaged");
    await bad(slotURL(srv, 0, "restore"), { filename: "s-f16.bin" }, 400, "-ctk");
    // the slot still serves after the refusals
    const ok = await complete(srv);
    assert.equal(ok.choices.length, 1);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
  const plain = await startServer(["-np", "1", "-c", "256"]);
  try {
    const r = await postJSON(slotURL(plain, 0, "save"), { filename: "x.bin" });
    assert.equal(r.status, 501, r.text);
    assert.ok(r.json.error.message.includes("--slot-save-path"));
    assert.equal((await postJSON(slotURL(plain, 0, "erase"), "")).status, 200, "erase needs no directory");
  } finally {
    assert.equal(await plain.stop(), 0);
  }
});
