// The official openai client against kvq-server (demo model, no chat template:
// chat messages are joined as plain text and a reply is the rest of the line).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import OpenAI from "openai";
import { startServer, postJSON, metric } from "./lib.mjs";

let srv, client;
before(async () => {
  srv = await startServer(["-np", "2", "-c", "512"]);
  client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
});
after(async () => { assert.equal(await srv.stop(), 0, "SIGTERM exits 0"); });

const chatReq = { model: "demo", messages: [{ role: "user", content: "The jury said" }], max_tokens: 16, temperature: 0 };

async function streamText(stream) {
  let text = "", finish = null, usage = null, chunks = [];
  for await (const ch of stream) {
    if (ch.usage) usage = ch.usage;
    const c = ch.choices[0];
    if (!c) continue;
    const piece = c.delta ? c.delta.content : c.text;
    if (piece) { text += piece; chunks.push(piece); }
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { text, finish, usage, chunks };
}

async function promptTokens(text) {
  const r = await postJSON(srv.url + "/tokenize", { content: text, add_special: true });
  assert.equal(r.status, 200);
  return r.json.tokens.length;
}

test("models and health", async () => {
  const models = await client.models.list();
  assert.equal(models.data[0].id, "demo");
  const h = await (await fetch(srv.url + "/health")).json();
  assert.equal(h.status, "ok");
  assert.equal(h.slots_idle, 2);
});

test("chat completion, not streamed: text, finish reason, usage", async () => {
  const r = await client.chat.completions.create(chatReq);
  const c = r.choices[0];
  assert.equal(r.object, "chat.completion");
  assert.equal(c.message.role, "assistant");
  assert.ok(c.message.content.length > 0, "a reply");
  assert.ok(!c.message.content.includes("\n"), "without a template the reply is the rest of the line");
  assert.ok(["stop", "length"].includes(c.finish_reason));
  assert.equal(r.usage.prompt_tokens, await promptTokens("The jury said"));
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 16);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test("chat completion streamed equals the whole answer (greedy), usage chunk", async () => {
  const whole = await client.chat.completions.create(chatReq);
  const s = await streamText(await client.chat.completions.create({ ...chatReq, stream: true, stream_options: { include_usage: true } }));
  assert.equal(s.text, whole.choices[0].message.content);
  assert.equal(s.finish, whole.choices[0].finish_reason);
  assert.deepEqual(s.usage.completion_tokens, whole.usage.completion_tokens);
  assert.equal(s.usage.prompt_tokens, whole.usage.prompt_tokens);
});

test("text completion, streamed and not, max_tokens gives finish_reason length", async () => {
  const req = { model: "demo", prompt: "The jury said", max_tokens: 12, temperature: 0 };
  const r = await client.completions.create(req);
  assert.equal(r.object, "text_completion");
  const c = r.choices[0];
  if (c.finish_reason === "length") assert.equal(r.usage.completion_tokens, 12);
  else assert.equal(c.finish_reason, "stop");
  assert.equal(r.usage.prompt_tokens, await promptTokens("The jury said"));
  const s = await streamText(await client.completions.create({ ...req, stream: true }));
  assert.equal(s.text, c.text);
  assert.equal(s.finish, c.finish_reason);
  // a prompt as token ids gives the same
  const ids = (await postJSON(srv.url + "/tokenize", { content: "The jury said", add_special: true })).json.tokens;
  const r2 = await client.completions.create({ ...req, prompt: ids });
  assert.equal(r2.choices[0].text, c.text);
});

test("stop strings, across token boundaries, streamed and not", async () => {
  const req = { model: "demo", prompt: "The Fulton County Grand Jury said Friday", max_tokens: 32, temperature: 0 };
  const full = await streamText(await client.completions.create({ ...req, stream: true }));
  assert.ok(full.chunks.length >= 6, "enough pieces to cut: " + JSON.stringify(full.chunks));
  // the last character of one piece and the first of the next: the stop string spans two tokens
  let k = 3;
  while (k < full.chunks.length - 1 && (full.chunks[k].length < 1 || full.chunks[k + 1].length < 1)) k++;
  const stop = full.chunks[k].slice(-1) + full.chunks[k + 1].slice(0, 2);
  const expect = full.text.slice(0, full.text.indexOf(stop));
  const r = await client.completions.create({ ...req, stop: [stop, "\u0000never"] });
  assert.equal(r.choices[0].text, expect, "cut before the stop string " + JSON.stringify(stop));
  assert.equal(r.choices[0].finish_reason, "stop");
  const s = await streamText(await client.completions.create({ ...req, stop, stream: true }));
  assert.equal(s.text, expect);
  assert.equal(s.finish, "stop");
  assert.ok(!s.text.includes(stop));
});

test("seed: the same seed at temperature 1 gives the same text, others differ", async () => {
  const req = { model: "demo", prompt: "The jury said", max_tokens: 24, temperature: 1.0, top_k: 0, top_p: 1, min_p: 0 };
  const a = await client.completions.create({ ...req, seed: 42 });
  const b = await client.completions.create({ ...req, seed: 42 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  const others = [];
  for (const seed of [1, 2, 3]) others.push((await client.completions.create({ ...req, seed })).choices[0].text);
  assert.ok(others.some((t) => t !== a.choices[0].text), "some other seed samples differently");
});

test("presence and frequency penalties change a greedy reply", async () => {
  const req = { model: "demo", prompt: "the the the the the", max_tokens: 24, temperature: 0 };
  const plain = await client.completions.create(req);
  const pen = await client.completions.create({ ...req, frequency_penalty: 2, presence_penalty: 2 });
  assert.notEqual(pen.choices[0].text, plain.choices[0].text);
});

test("a repeated prompt reuses the cached prefix", async () => {
  const req = { model: "demo", prompt: "It was a bright cold day in April, and the clocks", max_tokens: 4, temperature: 0 };
  await client.completions.create(req);
  const r = await client.completions.create(req);
  assert.ok(r.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 1);
  assert.ok((await metric(srv.url, "prompt_tokens_cached_total")) > 0);
});

test("two conversations taking turns on two slots each keep their cache", async () => {
  // a new conversation sharing only BOS with a slot's takes the other (least recently used) slot
  const turn = (msgs) => client.chat.completions.create({ model: "demo", messages: msgs, max_tokens: 6, temperature: 0 });
  const convs = ["Alpha said that the city", "Bravo wrote to the county"].map((t) => [{ role: "user", content: t }]);
  const first = [];
  for (const msgs of convs) {
    const r = await turn(msgs);
    first.push(r.usage.prompt_tokens);
    msgs.push({ role: "assistant", content: r.choices[0].message.content }, { role: "user", content: "and then?" });
  }
  for (const [i, msgs] of convs.entries()) {
    const r = await turn(msgs);
    assert.ok(r.usage.prompt_tokens_details.cached_tokens >= first[i] - 1,
              `conversation ${i}: turn 2 cached ${r.usage.prompt_tokens_details.cached_tokens} of ${first[i]}`);
  }
});

test("tokenize and detokenize round trip", async () => {
  const t = await postJSON(srv.url + "/tokenize", { content: "Hello world" });
  assert.ok(t.json.tokens.length >= 2);
  const d = await postJSON(srv.url + "/detokenize", { tokens: t.json.tokens });
  assert.equal(d.json.content, "Hello world");
});

test("metrics in Prometheus text", async () => {
  const text = await (await fetch(srv.url + "/metrics")).text();
  for (const name of ["kvq_requests_total{route=\"completions\"}", "kvq_generated_tokens_total", "kvq_slots_busy",
                      "kvq_kv_cache_bytes_used", "kvq_generation_tokens_per_second"])
    assert.ok(text.includes(name), name);
  assert.ok((await metric(srv.url, "generated_tokens_total")) > 0);
  assert.ok((await metric(srv.url, "kv_cache_bytes_total")) > 0);
});

test("--api-key: 401 without it, served with it; / and /health stay open", async () => {
  const s = await startServer(["-np", "1", "-c", "256", "--api-key", "sekrit"]);
  try {
    const bad = new OpenAI({ baseURL: s.url + "/v1", apiKey: "wrong", maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e.status === 401);
    const r = await postJSON(s.url + "/v1/completions", { prompt: "x", max_tokens: 1 });
    assert.equal(r.status, 401);
    assert.equal(r.json.error.type, "authentication_error");
    const good = new OpenAI({ baseURL: s.url + "/v1", apiKey: "sekrit", maxRetries: 0 });
    const c = await good.completions.create({ model: "demo", prompt: "The jury", max_tokens: 2 });
    assert.equal(c.usage.completion_tokens > 0, true);
    assert.equal((await fetch(s.url + "/health")).status, 200);
    assert.equal((await fetch(s.url + "/")).status, 200);
  } finally {
    assert.equal(await s.stop(), 0);
  }
});

test("SIGTERM while a stream runs: the stream ends, exit status 0", async () => {
  const s = await startServer(["-np", "1", "-c", "1024"]);
  const c = new OpenAI({ baseURL: s.url + "/v1", apiKey: "none", maxRetries: 0 });
  const stream = await c.completions.create({ model: "demo", prompt: "The jury said", max_tokens: 1000, stream: true });
  let n = 0, stopping = null;
  for await (const ch of stream) {
    if (++n === 2) stopping = s.stop("SIGTERM");
    if (n > 5000) break;
  }
  assert.equal(await stopping, 0);
});

const LLAMA3 = new URL("../../../shared/fixtures/models/llama3-tiny-aqlm-1x16g16", import.meta.url).pathname;
test("a model with a chat template (llama3 fixture)", { skip: fs.existsSync(LLAMA3) ? false : "no ../shared fixtures" }, async () => {
  const s = await startServer(["-np", "1", "-c", "256"], { model: LLAMA3 });
  try {
    const c = new OpenAI({ baseURL: s.url + "/v1", apiKey: "none", maxRetries: 0 });
    const m = await c.models.list();
    assert.equal(m.data[0].meta.chat_template, "llama3");
    const msgs = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello there" }];
    const r = await c.chat.completions.create({ model: "x", messages: msgs, max_tokens: 8, temperature: 0 });
    const raw = (await postJSON(s.url + "/tokenize", { content: "Be brief.Hello there" })).json.tokens.length;
    assert.ok(r.usage.prompt_tokens > raw + 8, "the template's header tokens are in the prompt");
    const st = await streamText(await c.chat.completions.create({ model: "x", messages: msgs, max_tokens: 8, temperature: 0, stream: true }));
    assert.equal(st.text, r.choices[0].message.content);
  } finally {
    assert.equal(await s.stop(), 0);
  }
});

test("command line: --help, --version, bad flags (a bad -ngl too) are one line and status 1", async () => {
  const { spawnSync } = await import("node:child_process");
  const { BIN } = await import("./lib.mjs");
  const run = (...a) => spawnSync(BIN, a, { encoding: "utf8" });
  let r = run("--help");
  assert.equal(r.status, 0);
  assert.match(r.stdout, /usage: kvq-server/);
  r = run("--version");
  assert.equal(r.status, 0);
  assert.match(r.stdout, /^kvq-server \d+\.\d+\.\d+\n$/);
  for (const args of [["--no-such-flag"], ["--port", "70000"], ["-np", "0"], ["-ngl", "many"], ["-ctk", "q5"],
                      ["--chat-template", "nope"], ["-m", "/nonexistent"]]) {
    r = run(...args);
    assert.equal(r.status, 1, args.join(" "));
    assert.equal(r.stderr.trim().split("\n").length, 1, args.join(" ") + ": one line: " + r.stderr);
    assert.match(r.stderr, /^kvq-server: /);
  }
});
