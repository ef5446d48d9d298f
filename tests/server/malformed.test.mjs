// A corpus of bad requests: each answers 4xx with an OpenAI error object, and
// the server keeps serving (checked after every case and at the end).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import { startServer, postJSON } from "./lib.mjs";

let srv;
before(async () => { srv = await startServer(["-np", "2", "-c", "256"]); });
after(async () => { assert.equal(await srv.stop(), 0); });

const CHAT = "/v1/chat/completions", CMPL = "/v1/completions";
const user = [{ role: "user", content: "hi" }];
const CASES = [
  // [path, body (string: sent as is), expected status, a word the message must contain]
  [CHAT, "not json", 400, "JSON"],
  [CHAT, "{\"messages\": [", 400, "JSON"],
  [CHAT, "", 400, "empty"],
  [CHAT, "[]", 400, "object"],
  [CHAT, "\"str\"", 400, "object"],
  [CHAT, {}, 400, "messages"],
  [CHAT, { messages: "hi" }, 400, "array"],
  [CHAT, { messages: [] }, 400, "empty"],
  [CHAT, { messages: [5] }, 400, "object"],
  [CHAT, { messages: [{ role: "wizard", content: "x" }] }, 400, "role"],
  [CHAT, { messages: [{ role: 7, content: "x" }] }, 400, "role"],
  [CHAT, { messages: [{ role: "user" }] }, 400, "content"],
  [CHAT, { messages: [{ role: "user", content: 5 }] }, 400, "content"],
  [CHAT, { messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] }, 400, "text"],
  [CHAT, { messages: user, max_tokens: 0 }, 400, "max_tokens"],
  [CHAT, { messages: user, max_tokens: -5 }, 400, "max_tokens"],
  [CHAT, { messages: user, max_tokens: "5" }, 400, "max_tokens"],
  [CHAT, { messages: user, max_tokens: 1.5 }, 400, "max_tokens"],
  [CHAT, { messages: user, temperature: "hot" }, 400, "temperature"],
  [CHAT, { messages: user, temperature: -1 }, 400, "temperature"],
  [CHAT, { messages: user, temperature: 3 }, 400, "temperature"],
  [CHAT, { messages: user, top_p: 2 }, 400, "top_p"],
  [CHAT, { messages: user, top_k: -1 }, 400, "top_k"],
  [CHAT, { messages: user, min_p: "a" }, 400, "min_p"],
  [CHAT, { messages: user, n: 3 }, 400, "slots"],
  [CHAT, { messages: user, n: 0 }, 400, "'n'"],
  [CMPL, { prompt: "x", n: 17 }, 400, "'n'"],
  [CMPL, { prompt: "x", n: "2" }, 400, "'n'"],
  [CMPL, { prompt: "x", n: 1.5 }, 400, "'n'"],
  [CHAT, { messages: user, stop: 5 }, 400, "stop"],
  [CHAT, { messages: user, stop: [1] }, 400, "stop"],
  [CHAT, { messages: user, stop: ["a", "b", "c", "d", "e"] }, 400, "stop"],
  // tool calling (tools.test.mjs has the rest): malformed tools, tool_choice, tool messages
  [CHAT, { messages: user, tools: [{ type: "function", function: {} }] }, 400, "function.name"],
  [CHAT, { messages: user, tools: [{ type: "function", function: { name: "f", parameters: "x" } }] }, 400, "parameters"],
  [CHAT, { messages: user, tools: [{ type: "retrieval" }] }, 400, "type"],
  [CHAT, { messages: user, tools: [{ type: "function", function: { name: "f" } }], tool_choice: { type: "function", function: { name: "g" } } }, 400, "tool_choice"],
  [CHAT, { messages: user, tools: [{ type: "function", function: { name: "f" } }] }, 400, "no tool calling"],
  [CHAT, { messages: [{ role: "tool", content: "1", tool_call_id: 5 }] }, 400, "tool_call_id"],
  [CHAT, { messages: [{ role: "assistant", content: null, tool_calls: [{ function: {} }] }] }, 400, "function.name"],
  [CMPL, { prompt: "x", tools: [{ type: "function", function: { name: "f" } }] }, 400, "chat"],
  [CHAT, { messages: user, stream: "yes" }, 400, "stream"],
  [CHAT, { messages: user, stream_options: 3 }, 400, "stream_options"],
  [CHAT, { messages: user, seed: "x" }, 400, "seed"],
  [CHAT, { messages: user, presence_penalty: 5 }, 400, "presence_penalty"],
  [CHAT, { messages: user, frequency_penalty: -3 }, 400, "frequency_penalty"],
  [CHAT, { messages: user, logprobs: 3 }, 400, "logprobs"],
  [CHAT, { messages: user, logprobs: true, top_logprobs: 21 }, 400, "top_logprobs"],
  [CHAT, { messages: user, model: 5 }, 400, "model"],
  [CMPL, {}, 400, "prompt"],
  [CMPL, { prompt: 5 }, 400, "prompt"],
  [CMPL, { prompt: [] }, 400, "prompt"],
  [CMPL, { prompt: [-1] }, 400, "prompt"],
  [CMPL, { prompt: [1, 99999999] }, 400, "vocabulary"],
  [CMPL, { prompt: [1, "a"] }, 400, "prompt"],
  [CMPL, { prompt: ["a", "b"] }, 400, "n > 1"],
  [CMPL, { prompt: "word ".repeat(400) }, 400, "context"],
  [CMPL, { prompt: "x", echo: 1 }, 400, "echo"],
  [CMPL, { prompt: "x", logprobs: 99 }, 400, "logprobs"],
  [CMPL, "[".repeat(100000), 400, "JSON"],
  [CMPL, "{\"prompt\": \"\\ud800\", \"max_tokens\": }", 400, "JSON"],
  ["/v1/embeddings", {}, 400, "input"],
  ["/v1/embeddings", "", 400, "JSON"],
  ["/v1/embeddings", { input: 5 }, 400, "input"],
  ["/v1/embeddings", { input: [] }, 400, "empty"],
  ["/v1/embeddings", { input: "" }, 400, "empty"],
  ["/v1/embeddings", { input: [[]] }, 400, "empty"],
  ["/v1/embeddings", { input: [{}] }, 400, "input[0]"],
  ["/v1/embeddings", { input: ["a", 7] }, 400, "input[1]"],
  ["/v1/embeddings", { input: [[1, "a"]] }, 400, "token id"],
  ["/v1/embeddings", { input: [99999999] }, 400, "token id"],
  ["/v1/embeddings", { input: "word ".repeat(400) }, 400, "context"],
  ["/v1/embeddings", { input: "x", encoding_format: "hex" }, 400, "encoding_format"],
  ["/tokenize", {}, 400, "content"],
  ["/tokenize", { content: 5 }, 400, "content"],
  ["/tokenize", { content: "x", add_special: "yes" }, 400, "add_special"],
  ["/detokenize", { tokens: "x" }, 400, "tokens"],
  ["/detokenize", { tokens: [-5] }, 400, "tokens"],
  ["/detokenize", { tokens: [1e12] }, 400, "tokens"],
  ["/detokenize", { tokens: [123456789] }, 400, "vocabulary"],
];

async function stillServing() {
  const h = await fetch(srv.url + "/health");
  assert.equal(h.status, 200, "the server still answers");
}

test("bad bodies: 400 with an error object naming the problem", async () => {
  for (const [path, body, status, word] of CASES) {
    const r = await postJSON(srv.url + path, body);
    const what = path + " " + (typeof body === "string" ? body.slice(0, 40) : JSON.stringify(body).slice(0, 80));
    assert.equal(r.status, status, what + ": " + r.text.slice(0, 200));
    assert.ok(r.json && r.json.error && typeof r.json.error.message === "string", what + ": error object");
    assert.equal(typeof r.json.error.type, "string");
    assert.ok(r.json.error.message.toLowerCase().includes(word.toLowerCase()), what + ": message " + r.json.error.message);
    await stillServing();
  }
});

test("the prompt longer than the context is refused with the numbers", async () => {
  const r = await postJSON(srv.url + CMPL, { prompt: "word ".repeat(400) });
  assert.equal(r.json.error.code, "context_length_exceeded");
  assert.match(r.json.error.message, /prompt is \d+ tokens; the context holds 256/);
});

test("routes and methods: 404, 405 with Allow", async () => {
  let r = await fetch(srv.url + "/v2/nothing");
  assert.equal(r.status, 404);
  assert.equal((await r.json()).error.type, "not_found_error");
  r = await fetch(srv.url + CHAT);
  assert.equal(r.status, 405);
  assert.match(r.headers.get("allow"), /POST/);
  r = await fetch(srv.url + "/v1/models", { method: "POST", body: "{}" });
  assert.equal(r.status, 405);
  r = await fetch(srv.url + "/health", { method: "PUT", body: "{}" });
  assert.equal(r.status, 405);
  await stillServing();
});

test("a body over the limit: 413", async () => {
  const big = JSON.stringify({ prompt: "a".repeat(9 << 20) });
  const r = await postJSON(srv.url + CMPL, big);
  assert.equal(r.status, 413);
  await stillServing();
});

test("garbage on the socket does not stop the server", async () => {
  for (const raw of ["GARBAGE\r\n\r\n", "POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n{",
                     "\x00\x01\x02\xff\r\n\r\n", "GET / HTTP/1.1\r\nHost: x\r\n" + "X-Long: " + "a".repeat(300000) + "\r\n\r\n"]) {
    await new Promise((resolve) => {
      const s = net.connect(srv.port, "127.0.0.1", () => { s.write(raw); setTimeout(() => s.end(), 50); });
      s.on("error", () => resolve());
      s.on("close", () => resolve());
      s.on("data", () => {});
      s.setTimeout(2000, () => s.destroy());
    });
    await stillServing();
  }
  const r = await postJSON(srv.url + CMPL, { prompt: "The jury said", max_tokens: 4 });
  assert.equal(r.status, 200);
  assert.equal(r.json.usage.completion_tokens > 0, true);
});
