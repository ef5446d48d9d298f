#!/usr/bin/env node
// kvq-server benchmark of prompt reuse: (1) one request with n = 3 against three concurrent n = 1
// requests of the same prompt on empty slots (each reads it), and (2) time to first token of a
// long document question cold, restored from the disk prefix cache, and from a slot.
//   node tests/server/bench_reuse.mjs [--server BUILD/kvq-server] [-m DIR] [-c N] [-p PROMPT_TOKENS] [-- extra server flags]
// Prints: choices n3_ms=<x> three_n1_ms=<x>, and prefix tokens=<n> cold_ttft_ms=<x> disk_ttft_ms=<x> slot_ttft_ms=<x> file_kib=<x>
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const dash = args.includes("--") ? args.indexOf("--") : args.length;
const opt = (name, dflt) => { const i = args.indexOf(name); return i >= 0 && i < dash ? args[i + 1] : dflt; };
const extra = args.slice(dash + 1);
process.env.KVQ_SERVER = opt("--server", path.join(here, "../../build/kvq-server"));
const { startServer } = await import("./lib.mjs");
const model = opt("-m", path.join(here, "../../models/demo"));
const nCtx = Number(opt("-c", "1024")), nPrompt = Number(opt("-p", "900"));
const ids = (k, salt) => Array.from({ length: k }, (_, i) => 1000 + ((i * 7919 + salt * 104729) % 20000));

async function ttft(client, prompt) { // ms to the first streamed token
  const t0 = performance.now();
  const s = await client.completions.create({ model: "m", prompt, max_tokens: 4, temperature: 0, stream: true });
  let first = 0;
  for await (const c of s) if (!first && c.choices.length && c.choices[0].text) first = performance.now();
  return (first || performance.now()) - t0;
}

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kvq-bench-reuse-"));
const srv = await startServer(["-np", "3", "-c", String(nCtx), "--slot-save-path", dir, "--prefix-cache", "256", ...extra], { model });
try {
  const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
  const req = (p) => ({ model: "m", prompt: p, max_tokens: 16, temperature: 0.8, seed: 1 });
  let t0 = performance.now();
  await client.completions.create({ ...req(ids(nPrompt, 1)), n: 3 });
  const n3 = performance.now() - t0;
  t0 = performance.now();
  await Promise.all([0, 1, 2].map(() => client.completions.create(req(ids(nPrompt, 2)))));
  const n1 = performance.now() - t0;
  console.log(`choices prompt_tokens=${nPrompt} n3_ms=${n3.toFixed(1)} three_n1_ms=${n1.toFixed(1)}`);

  // fill the three slots with other prompts so the document's slot is evicted to disk
  const doc = ids(nPrompt, 3);
  const cold = await ttft(client, doc);
  for (const salt of [4, 5, 6]) await ttft(client, ids(64, salt));
  const disk = await ttft(client, [...doc.slice(0, -1), 42]); // the same document, another last token
  const slot = await ttft(client, [...doc.slice(0, -1), 43]);
  const kib = fs.readdirSync(dir).reduce((s, f) => Math.max(s, fs.statSync(path.join(dir, f)).size), 0) / 1024;
  console.log(`prefix tokens=${nPrompt} cold_ttft_ms=${cold.toFixed(1)} disk_ttft_ms=${disk.toFixed(1)} slot_ttft_ms=${slot.toFixed(1)} file_kib=${kib.toFixed(0)}`);
} finally {
  await srv.stop();
  fs.rmSync(dir, { recursive: true, force: true });
}
