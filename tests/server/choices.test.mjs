// n > 1 through the openai client: n choices (index 0..n-1) from one evaluation of the prompt,
// usage counting the prompt once; greedy choices agree, seeded ones draw seed + index and
// repeat; streamed choices put together equal the whole answer; logprobs per choice; two
// requests wanting every slot take turns.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startServer, metric } from "./lib.mjs";

let srv, client;
before(async () => {
  srv = await startServer(["-np", "3", "-c", "512"]);
  client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
});
after(async () => { assert.equal(await srv.stop(), 0, "SIGTERM exits 0"); });

const prompt = "The jury said that the city of Atlanta should take steps to improve its";

test("greedy n = 3 on chat: three equal choices, the prompt counted once", async () => {
  const req = { model: "demo", messages: [{ role: "user", content: "The jury said" }], max_tokens: 10, temperature: 0 };
  const one = await client.chat.completions.create(req);
  const three = await client.chat.completions.create({ ...req, n: 3 });
  assert.deepEqual(three.choices.map((c) => c.index), [0, 1, 2]);
  for (const c of three.choices) assert.equal(c.message.content, one.choices[0].message.content);
  assert.equal(three.usage.prompt_tokens, one.usage.prompt_tokens);
  assert.equal(three.usage.completion_tokens, 3 * one.usage.completion_tokens);
});

test("seeded n = 3 on completions: choice i draws with seed + i, and repeats", async () => {
  const req = { model: "demo", prompt, max_tokens: 12, temperature: 1.0, seed: 7 };
  const before = await metric(srv.url, "prompt_tokens_cached_total");
  const a = await client.completions.create({ ...req, n: 3 });
  const cached = (await metric(srv.url, "prompt_tokens_cached_total")) - before;
  assert.ok(cached >= 2 * a.usage.prompt_tokens, `choices 1 and 2 took the prompt from choice 0's cache (${cached} cached)`);
  const b = await client.completions.create({ ...req, n: 3 });
  assert.deepEqual(b.choices.map((c) => c.text), a.choices.map((c) => c.text), "the same seed, the same choices");
  assert.ok(new Set(a.choices.map((c) => c.text)).size > 1, "sampled choices differ: " + JSON.stringify(a.choices.map((c) => c.text)));
  for (let i = 0; i < 3; i++) {
    const single = await client.completions.create({ ...req, seed: 7 + i });
    assert.equal(a.choices[i].text, single.choices[0].text, `choice ${i} is the seed ${7 + i} draw`);
  }
});

test("streamed n = 3: each index's chunks put together equal the whole answer", async () => {
  const req = { model: "demo", messages: [{ role: "user", content: "The old city had" }], max_tokens: 10, temperature: 0.8, seed: 3, n: 3 };
  const whole = await client.chat.completions.create(req);
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  const text = ["", "", ""], finish = [null, null, null];
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text[c.index] += c.delta.content || "";
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  assert.deepEqual(text, whole.choices.map((c) => c.message.content));
  assert.deepEqual(finish, whole.choices.map((c) => c.finish_reason));
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
});

test("logprobs per choice", async () => {
  const r = await client.completions.create({ model: "demo", prompt, max_tokens: 6, temperature: 1.0, seed: 11, n: 2, logprobs: 2 });
  assert.equal(r.choices.length, 2);
  let gen = 0;
  for (const c of r.choices) {
    assert.equal(c.logprobs.tokens.join(""), c.text, "the tokens spell the choice's text");
    assert.equal(c.logprobs.top_logprobs.length, c.logprobs.tokens.length);
    for (const lp of c.logprobs.token_logprobs) assert.ok(lp <= 0);
    gen += c.logprobs.tokens.length;
  }
  assert.equal(r.usage.completion_tokens, gen);
});

test("two n = 3 requests on 3 slots: the second's choices take the slots the first frees", async () => {
  const req = { model: "demo", prompt, max_tokens: 8, temperature: 0, n: 3 };
  const [a, b] = await Promise.all([client.completions.create(req), client.completions.create({ ...req, prompt: "It was a cold" })]);
  assert.equal(a.choices.length, 3);
  assert.equal(b.choices.length, 3);
  for (const c of [...a.choices, ...b.choices]) assert.ok(c.text.length > 0);
});
