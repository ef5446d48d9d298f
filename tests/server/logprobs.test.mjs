// logprobs / top_logprobs on chat and completions, echo on completions (the prompt's
// log-likelihood, checked against kvq-ppl), through the official openai client.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import os from "node:os";
import OpenAI from "openai";
import { startServer, postJSON, BUILD_DIR, MODEL } from "./lib.mjs";

let srv, client;
before(async () => {
  srv = await startServer(["-np", "2", "-c", "512"]);
  client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
});
after(async () => { assert.equal(await srv.stop(), 0, "SIGTERM exits 0"); });

const chatReq = { model: "demo", messages: [{ role: "user", content: "The jury said" }], max_tokens: 12, temperature: 0 };
const cmplReq = { model: "demo", prompt: "The old city had", max_tokens: 12, temperature: 0 };
const TEXT = "The jury said that the city had been quiet for a long time, and the people were happy with the mayor.";

// the checks every token's entry passes: logprob <= 0, k alternatives sorted best first,
// greedy picks the first of them
function checkChatEntry(e, k) {
  assert.ok(e.logprob <= 0, `logprob ${e.logprob} <= 0`);
  if (!e.token.includes("\uFFFD")) assert.deepEqual(e.bytes, [...Buffer.from(e.token, "utf8")]); // a byte token is part of a character
  assert.equal(e.top_logprobs.length, k);
  for (let i = 1; i < k; i++) assert.ok(e.top_logprobs[i - 1].logprob >= e.top_logprobs[i].logprob, "sorted");
  if (k > 0) {
    assert.equal(e.top_logprobs[0].token, e.token, "greedy: the chosen token is the most likely");
    assert.equal(e.top_logprobs[0].logprob, e.logprob);
  }
}


// A streamed text completion's text and its logprobs, chunk by chunk put together.
async function collectCompletion(stream) {
  const got = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  let text = "";
  for await (const ch of stream) {
    const x = ch.choices[0];
    if (!x) continue;
    text += x.text;
    if (x.logprobs) for (const k of Object.keys(got)) got[k].push(...x.logprobs[k]);
  }
  return { text, got };
}

test("chat: greedy tokens are the top-1 of their top_logprobs, sorted, of the requested length", async () => {
  const r = await client.chat.completions.create({ ...chatReq, logprobs: true, top_logprobs: 5 });
  const c = r.choices[0];
  assert.equal(c.logprobs.content.length, r.usage.completion_tokens);
  for (const e of c.logprobs.content) checkChatEntry(e, 5);
  // without top_logprobs: the chosen token only; without logprobs: null
  const r0 = await client.chat.completions.create({ ...chatReq, logprobs: true });
  assert.deepEqual(r0.choices[0].logprobs.content.map((e) => [e.token, e.logprob]),
                   c.logprobs.content.map((e) => [e.token, e.logprob]));
  for (const e of r0.choices[0].logprobs.content) assert.deepEqual(e.top_logprobs, []);
  const rn = await client.chat.completions.create(chatReq);
  assert.equal(rn.choices[0].logprobs, null);
});

test("chat: the top 20 are a distribution's head (sum of probabilities <= 1), independent of temperature", async () => {
  const r = await client.chat.completions.create({ ...chatReq, max_tokens: 6, logprobs: true, top_logprobs: 20 });
  for (const e of r.choices[0].logprobs.content) {
    checkChatEntry(e, 20);
    const sum = e.top_logprobs.reduce((s, t) => s + Math.exp(t.logprob), 0);
    assert.ok(sum <= 1 + 1e-5 && sum > 0, `sum of top-20 probabilities ${sum}`);
  }
  // the model's distribution: the first token's alternatives do not depend on the temperature
  const hot = await client.chat.completions.create({ ...chatReq, max_tokens: 1, temperature: 1.5, seed: 7, logprobs: true, top_logprobs: 20 });
  assert.deepEqual(hot.choices[0].logprobs.content[0].top_logprobs, r.choices[0].logprobs.content[0].top_logprobs);
});

test("chat: streamed logprobs equal the non-streamed ones", async () => {
  const req = { ...chatReq, logprobs: true, top_logprobs: 3 };
  const whole = await client.chat.completions.create(req);
  const s = await client.chat.completions.create({ ...req, stream: true });
  let content = [], text = "";
  for await (const ch of s) {
    const c = ch.choices[0];
    if (!c) continue;
    if (c.delta.content) text += c.delta.content;
    if (c.logprobs) content = content.concat(c.logprobs.content);
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.deepEqual(content, whole.choices[0].logprobs.content);
});

test("completions: tokens add up to the text, offsets point at them, streamed equals whole", async () => {
  const req = { ...cmplReq, logprobs: 3 };
  const whole = await client.completions.create(req);
  const c = whole.choices[0], lp = c.logprobs;
  const n = whole.usage.completion_tokens;
  for (const k of ["tokens", "token_logprobs", "top_logprobs", "text_offset"]) assert.equal(lp[k].length, n, k);
  assert.equal(lp.tokens.join(""), c.text, "the pieces add up to the text");
  for (let i = 0; i < n; i++) {
    assert.ok(c.text.startsWith(lp.tokens[i], lp.text_offset[i]), `token ${i} at its offset`);
    const top = Object.entries(lp.top_logprobs[i]);
    assert.ok(top.length >= 1 && top.length <= 3);
    assert.ok(lp.token_logprobs[i] <= 0);
    const best = Math.max(...top.map(([, v]) => v));
    assert.equal(best, lp.token_logprobs[i], "greedy: the chosen token is the most likely");
  }
  const s = await client.completions.create({ ...req, stream: true });
  const { text, got } = await collectCompletion(s);
  assert.equal(text, c.text);
  assert.deepEqual(got, lp);
});

test("echo: one entry per prompt token then the generated ones, the first null; streamed the same", async () => {
  const req = { ...cmplReq, logprobs: 2, echo: true, max_tokens: 5 };
  const r = await client.completions.create(req);
  const c = r.choices[0], lp = c.logprobs;
  assert.ok(c.text.startsWith(cmplReq.prompt), "the prompt comes back first");
  assert.equal(lp.tokens.length, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  for (let i = 1; i < lp.tokens.length; i++) {
    assert.ok(lp.token_logprobs[i] <= 0, `token ${i}`);
    assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1], "offsets grow");
  }
  for (let i = r.usage.prompt_tokens; i < lp.tokens.length; i++)
    assert.ok(c.text.startsWith(lp.tokens[i], lp.text_offset[i]), `generated token ${i} at its offset`);
  // the generated part equals a request without echo
  const plain = await client.completions.create({ ...cmplReq, logprobs: 2, max_tokens: 5 });
  assert.equal(c.text, cmplReq.prompt + plain.choices[0].text);
  assert.deepEqual(lp.token_logprobs.slice(r.usage.prompt_tokens), plain.choices[0].logprobs.token_logprobs);
  const s = await client.completions.create({ ...req, stream: true });
  const { text, got } = await collectCompletion(s);
  assert.equal(text, c.text);
  assert.deepEqual(got, lp);
});

// kvq-ppl -c N -b B scores the N tokens after BOS in one chunk, B positions per forward pass:
// the same numbers through its own code; the server scores 64 positions per step
function pplOf(text, n, batch) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kvq-lp-"));
  const file = path.join(dir, "text.txt");
  fs.writeFileSync(file, text);
  const out = execFileSync(path.join(BUILD_DIR, "kvq-ppl"),
                           ["-m", MODEL, "-f", file, "-c", String(n), "-b", String(batch), "-t", "1", "--backend", "cpu"],
                           { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] });
  fs.rmSync(dir, { recursive: true });
  return Number(out.match(/ppl = (\S+)/)[1]);
}

async function scorePrompt(text) {
  const ids = (await postJSON(srv.url + "/tokenize", { content: text, add_special: false })).json.tokens;
  const r = await client.completions.create({ model: "demo", prompt: [1, ...ids], max_tokens: 0, echo: true, logprobs: 0 });
  assert.equal(r.usage.completion_tokens, 0);
  assert.equal(r.choices[0].finish_reason, "length");
  const lp = r.choices[0].logprobs.token_logprobs;
  assert.equal(lp.length, ids.length + 1, "one entry per prompt token");
  assert.equal(lp[0], null);
  return { n: ids.length, nll: -lp.slice(1).reduce((s, v) => s + v, 0) };
}

test("echo with max_tokens 0 scores the prompt: its sum is kvq-ppl's log-likelihood", async () => {
  const one = await scorePrompt(TEXT);
  const ppl = pplOf(TEXT, one.n, one.n);
  assert.ok(Math.abs(Math.log(ppl) - one.nll / one.n) < 1e-4, `kvq-ppl ${ppl} vs server ${Math.exp(one.nll / one.n)}`);
  // a prompt longer than a scoring step: positions stay aligned across steps
  const long = [TEXT, TEXT, TEXT, TEXT].join(" ");
  const four = await scorePrompt(long);
  assert.ok(four.n > 64);
  const ppl4 = pplOf(long, four.n, 64);
  assert.ok(Math.abs(Math.log(ppl4) - four.nll / four.n) < 1e-3, `kvq-ppl ${ppl4} vs server ${Math.exp(four.nll / four.n)}`);
  assert.ok(Math.exp(four.nll / four.n) < ppl, "the repeats are easier to predict");
});

test("bad values are 400 with a message naming the field", async () => {
  const CHAT = srv.url + "/v1/chat/completions", CMPL = srv.url + "/v1/completions";
  const user = [{ role: "user", content: "hi" }];
  const cases = [
    [CHAT, { messages: user, logprobs: true, top_logprobs: 21 }, "top_logprobs"],
    [CHAT, { messages: user, logprobs: true, top_logprobs: -1 }, "top_logprobs"],
    [CHAT, { messages: user, logprobs: true, top_logprobs: 2.5 }, "top_logprobs"],
    [CHAT, { messages: user, logprobs: 1 }, "logprobs"],
    [CHAT, { messages: user, logprobs: "yes" }, "logprobs"],
    [CHAT, { messages: user, top_logprobs: 3 }, "logprobs"],
    [CHAT, { messages: user, echo: true }, "echo"],
    [CHAT, { messages: user, max_tokens: 0 }, "max_tokens"],
    [CMPL, { prompt: "x", logprobs: 21 }, "logprobs"],
    [CMPL, { prompt: "x", logprobs: true }, "logprobs"],
    [CMPL, { prompt: "x", logprobs: -1 }, "logprobs"],
    [CMPL, { prompt: "x", echo: "yes" }, "echo"],
    [CMPL, { prompt: "x", max_tokens: 0 }, "max_tokens"],
  ];
  for (const [url, body, word] of cases) {
    const r = await postJSON(url, body);
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.ok(r.json.error.message.includes(word), `${JSON.stringify(body)}: ${r.json.error.message}`);
  }
});
