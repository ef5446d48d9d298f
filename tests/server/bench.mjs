#!/usr/bin/env node
// kvq-server benchmark: aggregate generated tok/s at 1, 2, 4, 8 concurrent streams,
// time to first token of a 128-token prompt while the other streams decode, and
// KV cache MiB per stream (one slot of -c tokens).
//   node tests/server/bench.mjs [--server BUILD/kvq-server] [-m DIR] [-c N] [-n TOKENS] [-- extra server flags]
// e.g. node tests/server/bench.mjs -m models/demo -c 1024 -- -ctk q4 -ctv q4 -t 2
// Prints one line per level: server streams=<n> agg_tps=<x> ttft_ms=<x> kv_mib_per_stream=<x>, then the
// aggregate part's wall_s and the server's steps, step_s, decode_s, prompt_s (from /metrics)
// (--streams 1,8: the streams=1 line's TTFT is the prompt alone, the streams=8 line's beside 7
// decoding streams, which are cut off once the probe has its token)
import path from "node:path";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const dash = args.includes("--") ? args.indexOf("--") : args.length;
const opt = (name, dflt) => { const i = args.indexOf(name); return i >= 0 && i < dash ? args[i + 1] : dflt; };
const extra = args.slice(dash + 1);
process.env.KVQ_SERVER = opt("--server", path.join(here, "../../build/kvq-server"));
const { startServer, metric, postJSON } = await import("./lib.mjs");
const model = opt("-m", path.join(here, "../../models/demo"));
const nCtx = Number(opt("-c", "1024"));
const nGen = Number(opt("-n", "128"));
const levels = (opt("--streams", "1,2,4,8")).split(",").map(Number);
const maxStreams = Math.max(...levels);

const srv = await startServer(["-np", String(maxStreams), "-c", String(nCtx), ...extra], { model });
const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
const vocab = (await client.models.list()).data[0].meta.n_vocab;
let seed = 1;
const rnd = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed; };
// distinct prompts (random ids), so no stream reuses another's cache
const prompt = (n) => [1, ...Array.from({ length: n - 1 }, () => 100 + (rnd() % (vocab - 100)))];

// one stream: resolves to {tokens, ttft (ms), t0, tEnd}; `first` resolves at its first token
// (abort() ends it early: the TTFT probe's neighbours stop once it has its first token)
function stream(ids, max_tokens) {
  let markFirst;
  const first = new Promise((r) => { markFirst = r; });
  const ac = new AbortController();
  const done = (async () => {
    const t0 = performance.now();
    let ttft = 0, usage = null;
    try {
      const s = await client.completions.create({ model: "x", prompt: ids, max_tokens, temperature: 0, stream: true,
                                                 stream_options: { include_usage: true } }, { signal: ac.signal });
      for await (const ch of s) {
        if (!ttft && ch.choices[0]) { ttft = performance.now() - t0; markFirst(); }
        if (ch.usage) usage = ch.usage;
      }
    } catch (e) {
      if (!ac.signal.aborted) throw e;
    }
    markFirst();
    return { tokens: usage ? usage.completion_tokens : 0, ttft, t0, tEnd: performance.now() };
  })();
  return { first, done, abort: () => ac.abort() };
}

// the server's own clock over the aggregate part: its steps, and the forwards within them
// (decode_s + prompt_s; step_s adds sampling and publishing, wall_s the HTTP side and the client)
const timings = async () => Object.fromEntries(await Promise.all(
  ["steps_total", "step_seconds_total", "generation_seconds_total", "prompt_seconds_total"].map(async (k) => [k, await metric(srv.url, k)])));
const kvTotal = await metric(srv.url, "kv_cache_bytes_total");
const kvPerStream = kvTotal / maxStreams / (1 << 20);
await stream(prompt(32), 8).done; // warm up
for (const n of levels) {
  // aggregate: n streams of nGen tokens from 32-token prompts, all started together
  const m0 = await timings();
  const t0 = performance.now();
  const runs = await Promise.all(Array.from({ length: n }, () => stream(prompt(32), nGen).done));
  const wall = (Math.max(...runs.map((r) => r.tEnd)) - t0) / 1000;
  const m1 = await timings();
  const agg = runs.reduce((a, r) => a + r.tokens, 0) / wall;
  // time to first token of a 128-token prompt while n-1 other streams decode
  const others = Array.from({ length: n - 1 }, () => stream(prompt(32), 4 * nGen));
  await Promise.all(others.map((o) => o.first));
  const probe = await stream(prompt(128), 1).done;
  others.forEach((o) => o.abort());
  await Promise.all(others.map((o) => o.done));
  const d = (k) => (m1[k] - m0[k]).toFixed(2);
  console.log(`server streams=${n} agg_tps=${agg.toFixed(1)} ttft_ms=${probe.ttft.toFixed(1)} kv_mib_per_stream=${kvPerStream.toFixed(3)}` +
              ` wall_s=${wall.toFixed(2)} steps=${m1.steps_total - m0.steps_total} step_s=${d("step_seconds_total")}` +
              ` decode_s=${d("generation_seconds_total")} prompt_s=${d("prompt_seconds_total")}`);
}
await srv.stop();
