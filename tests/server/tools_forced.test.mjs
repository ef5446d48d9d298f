// Forced tool calls under the JSON grammar: with tool_choice "required" or a named function,
// the demo model (which knows nothing of tools) must still write a call that parses into
// tool_calls, names one of the tools, and whose arguments validate against that tool's
// parameters schema, at temperatures 0, 1.0 and 1.5, for Qwen2.5's, Mistral v0.3's,
// Llama-3.1's and Command-R's call formats. Also: tools with n > 1, and tools with response_format.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, postJSON } from "./lib.mjs";
import { demoWith, removeDemoDirs } from "./templates.mjs";

const TOOLS = [
  { type: "function", function: { name: "get_weather", description: "Weather for a city", parameters: {
    type: "object", properties: { city: { type: "string", maxLength: 12 }, unit: { type: "string", enum: ["C", "F"] } },
    required: ["city"] } } },
  { type: "function", function: { name: "plan_trip", description: "Plan a trip", parameters: {
    type: "object", properties: {
      days: { type: "integer" },
      stops: { type: "array", maxItems: 3, items: { type: "object", properties: {
        place: { type: "string", maxLength: 10 }, nights: { type: "integer" } }, required: ["place"] } },
      budget: { type: ["number", "null"] },
      flags: { type: "object", properties: { pets: { type: "boolean" } }, required: ["pets"] } },
    required: ["days", "stops", "flags"] } } },
];

// Command-R's template raises on a parameter without a description, an object without
// additionalProperties and a "null" type: its tools describe every parameter and keep to the rest.
const TOOLS_CR = structuredClone(TOOLS);
{
  const p = TOOLS_CR[1].function.parameters;
  delete p.properties.flags;
  p.required = ["days", "stops"];
  p.properties.budget.type = "number";
  for (const t of TOOLS_CR)
    for (const [k, v] of Object.entries(t.function.parameters.properties)) v.description = `the ${k}`;
}
const toolsFor = (fam) => (fam === "commandr" ? TOOLS_CR : TOOLS);

// A validator for the schema subset the tests use (independent of the server's engine).
function validate(v, s, at = "$") {
  const types = [].concat(s.type ?? []);
  const kind = v === null ? "null" : Array.isArray(v) ? "array" : Number.isInteger(v) ? "integer" : typeof v;
  if (types.length && !types.includes(kind) && !(kind === "integer" && types.includes("number")))
    throw new Error(`${at}: ${JSON.stringify(v)} is not ${types}`);
  if (s.enum && !s.enum.includes(v)) throw new Error(`${at}: ${v} not in enum`);
  if (kind === "string" && s.maxLength !== undefined && [...v].length > s.maxLength) throw new Error(`${at}: too long`);
  if (kind === "array") {
    if (s.maxItems !== undefined && v.length > s.maxItems) throw new Error(`${at}: too many items`);
    v.forEach((x, i) => s.items && validate(x, s.items, `${at}[${i}]`));
  }
  if (kind === "object") {
    for (const r of s.required ?? []) if (!(r in v)) throw new Error(`${at}: ${r} missing`);
    for (const [k, x] of Object.entries(v)) {
      if (!s.properties?.[k]) throw new Error(`${at}: unexpected ${k}`);
      validate(x, s.properties[k], `${at}.${k}`);
    }
  }
}

const servers = {};
before(async () => {
  const [qwen, mistral, llama, commandr] = await Promise.all([
    startServer(["-c", "2048", "-np", "3"], { model: demoWith("qwen2.5-7b-instruct") }),
    startServer(["-c", "2048"], { model: demoWith("mistral-7b-instruct-v0.3") }),
    startServer(["-c", "2048"], { model: demoWith("llama-3.1-instruct") }),
    startServer(["-c", "2048"], { model: demoWith("c4ai-command-r-v01") }),
  ]);
  Object.assign(servers, { qwen, mistral, llama, commandr });
});
after(async () => {
  for (const s of Object.values(servers)) assert.equal(await s.stop(), 0);
  removeDemoDirs();
});

const chat = (srv, body) => postJSON(srv.url + "/v1/chat/completions", body);
const msgs = [{ role: "user", content: "Plan a trip to the coast, and what is the weather there?" }];

function checkCall(choice, names, tag, tools = TOOLS) {
  assert.equal(choice.finish_reason, "tool_calls", `${tag}: ${JSON.stringify(choice)}`);
  const calls = choice.message.tool_calls;
  assert.equal(calls.length, 1, tag);
  const f = calls[0].function;
  assert.ok(names.includes(f.name), `${tag}: ${f.name}`);
  const schema = tools.find((t) => t.function.name === f.name).function.parameters;
  validate(JSON.parse(f.arguments), schema);
  return f.name;
}

for (const fam of ["qwen", "mistral", "llama", "commandr"]) {
  test(`${fam}: forced calls parse and validate at temperatures 0, 1.0, 1.5`, async () => {
    for (const temperature of [0, 1.0, 1.5]) {
      for (let seed = 1; seed <= (temperature ? 3 : 1); seed++) {
        const tools = toolsFor(fam);
        const base = { messages: msgs, tools, max_tokens: 1000, temperature, seed };
        const tag = `${fam} t=${temperature} seed=${seed}`;
        const req = await chat(servers[fam], { ...base, tool_choice: "required" });
        assert.equal(req.status, 200, req.text);
        checkCall(req.json.choices[0], ["get_weather", "plan_trip"], tag + " required", tools);
        const named = await chat(servers[fam], { ...base, tool_choice: { type: "function", function: { name: "plan_trip" } } });
        assert.equal(named.status, 200, named.text);
        checkCall(named.json.choices[0], ["plan_trip"], tag + " named", tools);
      }
    }
  });
}

test("qwen: a forced call streamed gives the same call as not streamed", async () => {
  const body = { messages: msgs, tools: TOOLS, max_tokens: 1000, temperature: 0, tool_choice: "required" };
  const whole = await chat(servers.qwen, body);
  const r = await fetch(servers.qwen.url + "/v1/chat/completions", { method: "POST", headers: { "Content-Type": "application/json" },
                                                                  body: JSON.stringify({ ...body, stream: true }) });
  const calls = [];
  let finish = null;
  for (const line of (await r.text()).split("\n")) {
    if (!line.startsWith("data: {")) continue;
    const x = JSON.parse(line.slice(6)).choices[0];
    if (x?.delta?.tool_calls) calls.push(...x.delta.tool_calls);
    if (x?.finish_reason) finish = x.finish_reason;
  }
  assert.equal(finish, "tool_calls");
  assert.deepEqual(calls.map((c) => c.function), whole.json.choices[0].message.tool_calls.map((c) => c.function));
});

test("qwen: tools with n = 3 (not streamed): each choice is a valid call; streamed is a 400", async () => {
  const body = { messages: msgs, tools: TOOLS, max_tokens: 1000, temperature: 1.0, seed: 7, n: 3, tool_choice: "required" };
  const r = await chat(servers.qwen, body);
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices.length, 3);
  r.json.choices.forEach((c, i) => checkCall(c, ["get_weather", "plan_trip"], `choice ${i}`));
  // "auto" with n = 3: each choice is content or calls, never an error
  const auto = await chat(servers.qwen, { ...body, tool_choice: "auto", max_tokens: 8 });
  assert.equal(auto.status, 200, auto.text);
  assert.equal(auto.json.choices.length, 3);
  const s = await chat(servers.qwen, { ...body, stream: true });
  assert.equal(s.status, 400, s.text);
  assert.match(s.json.error.message, /n > 1 are not streamed/);
});

test("tools with response_format: tool_choice none gives schema-valid JSON content; otherwise a 400", async () => {
  const schema = TOOLS[1].function.parameters;
  const rf = { type: "json_schema", json_schema: { name: "trip", schema, strict: true } };
  for (const temperature of [0, 1.5]) {
    const r = await chat(servers.qwen, { messages: msgs, tools: TOOLS, tool_choice: "none", response_format: rf, max_tokens: 1000,
                                         temperature, seed: 3 });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].finish_reason, "stop");
    validate(JSON.parse(r.json.choices[0].message.content), schema);
  }
  for (const tool_choice of ["auto", "required"]) {
    const r = await chat(servers.qwen, { messages: msgs, tools: TOOLS, tool_choice, response_format: rf, max_tokens: 4 });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /tool_choice \\?"none\\?"/);
  }
});

test("400: a forced function whose parameters the grammar cannot take", async () => {
  const bad = [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { x: { type: "string", pattern: "(" } } } } }];
  const r = await chat(servers.qwen, { messages: msgs, tools: bad, tool_choice: "required", max_tokens: 4 });
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.code, "invalid_json_schema");
  // "auto" does not need the schema compiled: accepted
  const ok = await chat(servers.qwen, { messages: msgs, tools: bad, max_tokens: 2 });
  assert.equal(ok.status, 200, ok.text);
});
