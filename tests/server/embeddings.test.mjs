// /v1/embeddings through the openai client (which asks for base64) and as plain floats: the
// mean-pooled, L2-normalised final hidden state; the same text gives the same vector, other
// texts other ones, a batch keeps its order, token ids equal their text, and the slots'
// conversations keep their caches.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startServer, postJSON } from "./lib.mjs";

let srv, client;
before(async () => {
  srv = await startServer(["-np", "1", "-c", "256"]);
  client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
});
after(async () => { assert.equal(await srv.stop(), 0, "SIGTERM exits 0"); });

const A = "The jury said that the city had been quiet.", B = "It was a cold morning in the mountains.", C = "Money and taxes";
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const dist = (u, v) => Math.sqrt(u.reduce((s, x, i) => s + (x - v[i]) ** 2, 0));

test("one text: a unit vector of the model's width", async () => {
  const r = await client.embeddings.create({ model: "demo", input: A });
  assert.equal(r.object, "list");
  assert.equal(r.data.length, 1);
  assert.equal(r.data[0].embedding.length, 256);
  assert.ok(Math.abs(norm(r.data[0].embedding) - 1) < 1e-5);
  assert.ok(r.usage.prompt_tokens > 5);
});

test("a batch: same text same vector, other texts differ, order kept, floats = base64", async () => {
  const r = await client.embeddings.create({ model: "demo", input: [A, B, A, C] });
  const v = r.data.map((d) => d.embedding);
  assert.deepEqual(r.data.map((d) => d.index), [0, 1, 2, 3]);
  assert.deepEqual(v[0], v[2]);
  assert.ok(dist(v[0], v[1]) > 0.05 && dist(v[0], v[3]) > 0.05 && dist(v[1], v[3]) > 0.05);
  const back = await client.embeddings.create({ model: "demo", input: [C, A, B] });
  assert.deepEqual(back.data.map((d) => d.embedding), [v[3], v[0], v[1]], "each vector follows its text");
  const plain = await postJSON(srv.url + "/v1/embeddings", { input: [A, B], encoding_format: "float" });
  assert.equal(plain.status, 200, plain.text);
  for (let i = 0; i < 2; i++) assert.ok(dist(plain.json.data[i].embedding, v[i]) < 1e-6, "base64 and floats agree");
});

test("token ids give the vector of their text", async () => {
  const tok = await postJSON(srv.url + "/tokenize", { content: B, add_special: true });
  const ids = tok.json.tokens;
  const r = await client.embeddings.create({ model: "demo", input: [ids] });
  const t = await client.embeddings.create({ model: "demo", input: B });
  assert.deepEqual(r.data[0].embedding, t.data[0].embedding);
  assert.equal(r.usage.prompt_tokens, ids.length);
  const single = await client.embeddings.create({ model: "demo", input: ids });
  assert.deepEqual(single.data[0].embedding, t.data[0].embedding, "one token array");
});

test("embeddings leave the slot's conversation cached", async () => {
  const req = { model: "demo", prompt: "The jury said that the city of Atlanta", max_tokens: 6, temperature: 0 };
  const first = await client.completions.create(req);
  await client.embeddings.create({ model: "demo", input: [A, B] });
  const again = await client.completions.create(req);
  assert.equal(again.choices[0].text, first.choices[0].text);
  assert.equal(again.usage.prompt_tokens_details.cached_tokens, again.usage.prompt_tokens, "the slot kept its cache");
});
