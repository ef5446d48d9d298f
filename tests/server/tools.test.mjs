// Tool calling on /v1/chat/completions through the official openai client: the tools
// reach the prompt through the template's own tool branches (checked against the Jinja
// rendering in tests/data/chat_templates/expected.json), replies stream with tools on,
// and malformed tools, tool_choice and tool messages are refused with OpenAI-style 400s.
// The demo model makes no tool calls by itself: parsing calls out of a reply is covered
// by test_chat_tools (C) on canned replies.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import OpenAI from "openai";
import { startServer, postJSON } from "./lib.mjs";
import { TEMPLATES, demoWith, removeDemoDirs } from "./templates.mjs";


const convs = JSON.parse(fs.readFileSync(path.join(TEMPLATES, "conversations.json"), "utf8"));
const expected = JSON.parse(fs.readFileSync(path.join(TEMPLATES, "expected.json"), "utf8"));
const conv = (name) => convs.find((c) => c.name === name);
const rendering = (tmpl, name) =>
  expected.find((c) => c.template === tmpl && c.conversation === name && c.add_generation_prompt).text;

let qwen, mistral, plain, client;
before(async () => {
  [qwen, mistral, plain] = await Promise.all([
    startServer(["-c", "4096", "-np", "2"], { model: demoWith("qwen2.5-7b-instruct") }),
    startServer(["-c", "2048"], { model: demoWith("mistral-7b-instruct-v0.3") }),
    startServer(["-c", "512"]),
  ]);
  client = new OpenAI({ baseURL: qwen.url + "/v1", apiKey: "none", maxRetries: 0 });
});
after(async () => {
  for (const s of [qwen, mistral, plain]) if (s) assert.equal(await s.stop(), 0);
  removeDemoDirs();
});

// the prompt's token count equals that of the Jinja rendering, tokenized as is
async function promptTokens(srv, text) {
  const r = await postJSON(srv.url + "/tokenize", { content: text, add_special: false });
  assert.equal(r.status, 200, r.text);
  return r.json.tokens.length;
}

for (const name of ["tools_user", "tools_call_result", "tools_two_calls"]) {
  test(`qwen2.5: ${name} is rendered as Jinja renders it`, async () => {
    const c = conv(name);
    const r = await client.chat.completions.create({ model: "demo", messages: c.messages, tools: c.tools, max_tokens: 4, temperature: 0 });
    assert.equal(r.usage.prompt_tokens, await promptTokens(qwen, rendering("qwen2.5-7b-instruct", name)));
    // tool_choice "none": the tools stay out of the prompt
    const none = await client.chat.completions.create({ model: "demo", messages: [{ role: "user", content: "Hi" }], tools: c.tools,
                                                        tool_choice: "none", max_tokens: 1, temperature: 0 });
    const bare = await client.chat.completions.create({ model: "demo", messages: [{ role: "user", content: "Hi" }], max_tokens: 1, temperature: 0 });
    assert.equal(none.usage.prompt_tokens, bare.usage.prompt_tokens);
  });
}

test("mistral v0.3: tools and results go into the prompt as Jinja renders them", async () => {
  const c = conv("tools_call_result");
  const r = await postJSON(mistral.url + "/v1/chat/completions", { messages: c.messages, tools: c.tools, max_tokens: 2, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.usage.prompt_tokens, await promptTokens(mistral, rendering("mistral-7b-instruct-v0.3", "tools_call_result")));
});

test("tool_choice required / named: the reply starts as a call in the template's format", async () => {
  const c = conv("tools_user");
  const base = { messages: c.messages, tools: c.tools, max_tokens: 4, temperature: 0 };
  const named = await client.chat.completions.create({ model: "demo", ...base,
                                                       tool_choice: { type: "function", function: { name: "get_weather" } } });
  const q = rendering("qwen2.5-7b-instruct", "tools_user");
  assert.equal(named.usage.prompt_tokens, await promptTokens(qwen, q + '<tool_call>\n{"name": "get_weather", "arguments": '));
  // "required" with one tool names it; with several, the prefill stops before the name
  const req = await client.chat.completions.create({ model: "demo", ...base, tool_choice: "required" });
  assert.equal(req.usage.prompt_tokens, named.usage.prompt_tokens);
  const m = await postJSON(mistral.url + "/v1/chat/completions", { ...base, tool_choice: "required" });
  assert.equal(m.status, 200, m.text);
  assert.equal(m.json.usage.prompt_tokens,
               await promptTokens(mistral, rendering("mistral-7b-instruct-v0.3", "tools_user") + '[TOOL_CALLS] [{"name": "get_weather", "arguments": '));
  // streamed, the prefilled start is not sent as content
  let text = "";
  for await (const ch of await client.chat.completions.create({ model: "demo", ...base, tool_choice: "required", stream: true }))
    text += ch.choices[0]?.delta?.content ?? "";
  assert.ok(!text.startsWith("<tool_call>"), text);
  assert.equal(text, req.choices[0].message.content ?? "");
});

test("streamed with tools: the same reply as not streamed, and a finish_reason", async () => {
  const c = conv("tools_user");
  const req = { model: "demo", messages: c.messages, tools: c.tools, tool_choice: "auto", max_tokens: 16, temperature: 0 };
  const whole = await client.chat.completions.create(req);
  let text = "", calls = [], finish = null;
  for await (const ch of await client.chat.completions.create({ ...req, stream: true })) {
    const x = ch.choices[0];
    if (!x) continue;
    text += x.delta.content ?? "";
    if (x.delta.tool_calls) calls.push(...x.delta.tool_calls);
    if (x.finish_reason) finish = x.finish_reason;
  }
  const m = whole.choices[0].message;
  assert.equal(finish, whole.choices[0].finish_reason);
  if (m.tool_calls) { // a call the demo model happened to write: the same calls both ways
    assert.equal(finish, "tool_calls");
    assert.deepEqual(calls.map((t) => t.function), m.tool_calls.map((t) => t.function));
  } else {
    assert.equal(text, m.content);
    assert.deepEqual(calls, []);
  }
});

const err400 = async (srv, body, pattern) => {
  const r = await postJSON(srv.url + "/v1/chat/completions", { max_tokens: 1, ...body });
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.type, "invalid_request_error");
  assert.match(r.json.error.message, pattern);
};
const user = [{ role: "user", content: "Weather?" }];
const weather = conv("tools_user").tools;

test("400: malformed tools, unknown tool_choice, tools without template support", async () => {
  await err400(qwen, { messages: user, tools: [{ type: "function", function: { description: "no name" } }] }, /function\.name/);
  await err400(qwen, { messages: user, tools: [{ type: "function", function: { name: "f", parameters: [] } }] }, /parameters must be an object/);
  await err400(qwen, { messages: user, tools: { type: "function" } }, /'tools' must be an array/);
  await err400(qwen, { messages: user, tools: weather, tool_choice: { type: "function", function: { name: "nope" } } }, /not in 'tools'/);
  await err400(qwen, { messages: user, tools: weather, tool_choice: "sometimes" }, /tool_choice/);
  await err400(qwen, { messages: user, tool_choice: "required" }, /'tools' is empty/);
  await err400(qwen, { messages: [{ role: "user", content: "x", tool_calls: [] }] }, /only assistant/);
  await err400(qwen, { messages: user, tools: weather, n: 2, stream: true }, /n > 1/);
  await err400(plain, { messages: user, tools: weather }, /no tool calling/);
  await err400(plain, { messages: conv("tools_call_result").messages }, /no tool calling/);
  // Mistral's template needs the 9-character call id on a tool result
  const msgs = conv("tools_call_result").messages.map(({ tool_call_id, ...m }) => m);
  await err400(mistral, { messages: msgs, tools: weather }, /template rejects/);
});
