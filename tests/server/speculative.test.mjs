// Speculative decoding in kvq-server (--lookup N, --draft DIR): greedy replies are token for
// token those of a server without drafts (alone, and two streams at once, penalties and stop
// strings included; f16 and q4 caches), and the drafted/accepted counts show in timings, /stats and /metrics.
// A draft model with another vocabulary is refused at start with one line.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";
import { startServer, metric, BIN, MODEL } from "./lib.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
// a passage said twice: prompt lookup finds its continuation
const DOC = "The jury said that the city of Atlanta should take steps to improve its election laws. " +
  "The grand jury commented on a number of other topics, among them the purchasing departments of the city. ";
const ASKS = [
  { prompt: DOC + DOC + "The jury", max_tokens: 40 },
  { prompt: "It was a cold morning in the mountains, and the", max_tokens: 32 },
  { prompt: DOC + "The grand", max_tokens: 24, presence_penalty: 0.5, frequency_penalty: 0.3 },
  { prompt: DOC + DOC + "The city", max_tokens: 40, stop: ["election"] },
];
const req = (a) => ({ model: "demo", temperature: 0, ...a });

async function run(args, fn) {
  const srv = await startServer(["-c", "512", ...args]);
  try {
    return await fn(srv, new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 }));
  } finally {
    assert.equal(await srv.stop(), 0);
  }
}

// each ask alone, then the first two at once (2 slots); texts and the summed draft counts
async function replies(args) {
  return run(["-np", "2", ...args], async (srv, client) => {
    const out = [];
    let drafted = 0, accepted = 0;
    const take = (r) => {
      drafted += r.timings.draft_n;
      accepted += r.timings.draft_n_accepted;
      assert.ok(r.timings.draft_n_accepted <= r.timings.draft_n);
      return r.choices[0].text + "|" + r.choices[0].finish_reason;
    };
    for (const a of ASKS) out.push(take(await client.completions.create(req(a))));
    const both = await Promise.all([ASKS[0], ASKS[3]].map((a) => client.completions.create(req(a))));
    out.push(...both.map(take));
    const stats = await (await fetch(srv.url + "/stats")).json();
    return { out, drafted, accepted, stats, metric: await metric(srv.url, "draft_tokens_total"),
             metricAcc: await metric(srv.url, "draft_tokens_accepted_total") };
  });
}

const plain = await replies([]);

test("plain server reports no drafts", () => {
  assert.equal(plain.drafted, 0);
  assert.equal(plain.metric, 0);
  assert.equal(plain.stats.draft_n, 0);
});

for (const [name, args] of [["--lookup 2", ["--lookup", "2"]], ["--draft (itself)", ["--draft", MODEL, "--draft-max", "4"]]]) {
  test(`${name}: greedy replies equal the plain server's; drafts counted`, async () => {
    const got = await replies(args);
    assert.deepEqual(got.out, plain.out);
    assert.ok(got.drafted > 0, `drafted ${got.drafted}`);
    assert.ok(got.accepted > 0, `accepted ${got.accepted}`);
    // the model drafting for itself agrees with itself (up to the rounding of other batch sizes)
    if (args.includes("--draft")) assert.ok(got.accepted >= 0.9 * got.drafted, `self-draft kept ${got.accepted} of ${got.drafted}`);
    assert.equal(got.stats.draft_n, got.drafted, "/stats counts every response's drafts");
    assert.equal(got.stats.draft_n_accepted, got.accepted);
    assert.equal(got.metric, got.drafted, "/metrics kvq_draft_tokens_total");
    assert.equal(got.metricAcc, got.accepted);
  });
}

test("--lookup 2 on a q4 cache: greedy replies equal the plain q4 server's (rollback of quantized rows)", async () => {
  const q4 = ["-ctk", "q4", "-ctv", "q4"];
  const base = await replies(q4), got = await replies([...q4, "--lookup", "2"]);
  // the requests one at a time: two at once on a q4 cache differ run to run on the plain
  // server too (which slot, and so which cached prefix, a request lands on)
  assert.deepEqual(got.out.slice(0, ASKS.length), base.out.slice(0, ASKS.length));
  assert.ok(got.drafted > 0 && got.accepted > 0);
});

test("sampling with drafts: a seeded request repeats, and the tokens stay in range", async () => {
  await run(["-np", "1", "--lookup", "2"], async (srv, client) => {
    const ask = req({ ...ASKS[0], temperature: 0.8, seed: 7 });
    const a = await client.completions.create(ask), b = await client.completions.create(ask);
    assert.equal(a.choices[0].text, b.choices[0].text);
    assert.ok(a.usage.completion_tokens > 0 && a.usage.completion_tokens <= 40);
  });
});

const OTHER = path.join(here, "../../../shared/fixtures/models/llama3-tiny-aqlm-1x16g16");
test("a draft model with another vocabulary is refused with one line", { skip: !fs.existsSync(OTHER) && "no ../shared fixtures" }, async () => {
  const p = spawn(BIN, ["--port", "0", "--backend", "cpu", "-t", "1", "-m", MODEL, "--draft", OTHER], { stdio: ["ignore", "pipe", "pipe"] });
  let err = "";
  p.stderr.on("data", (d) => { err += d; });
  const code = await new Promise((r) => p.on("exit", r));
  assert.equal(code, 1);
  const lines = err.trim().split("\n").filter((l) => l.includes("--draft"));
  assert.equal(lines.length, 1, err);
  assert.match(lines[0], /vocabulary|tokenizer/);
});
