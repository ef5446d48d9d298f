// response_format (structured output) through the official openai client: with the demo
// model (which writes nonsense) every reply, for several seeds and temperatures, on chat and
// completions, streamed or not, is JSON that parses and validates against the schema (nested
// objects, enums, arrays, required fields); max_tokens cuts a value short with "length"; bad
// schemas are 400s.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startServer, postJSON } from "./lib.mjs";

let srv, client;
before(async () => {
  srv = await startServer(["-np", "2", "-c", "1024"]);
  client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
});
after(async () => { assert.equal(await srv.stop(), 0, "SIGTERM exits 0"); });

// Every string bounded, so a value always ends within max_tokens.
const PERSON = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 16 },
    role: { enum: ["admin", "user", "guest"] },
    age: { type: "integer" },
    tags: { type: "array", items: { type: "string", maxLength: 6 }, minItems: 1, maxItems: 3 },
    address: {
      type: "object",
      properties: { city: { type: "string", maxLength: 10 }, zip: { type: "string", maxLength: 5 } },
      required: ["city"],
      additionalProperties: false,
    },
    active: { type: "boolean" },
    note: { anyOf: [{ type: "string", maxLength: 8 }, { type: "null" }] },
  },
  required: ["name", "role", "tags", "address"],
  additionalProperties: false,
};
const schemaFormat = (schema, strict = true) => ({ type: "json_schema", json_schema: { name: "person", schema, strict } });

// A validator for the subset, written from the JSON schema rules.
function validate(v, s, where = "$") {
  const fail = (why) => { throw new Error(`${where}: ${why} (${JSON.stringify(v)})`); };
  if (s.enum) { if (!s.enum.some((e) => JSON.stringify(e) === JSON.stringify(v))) fail("not in enum"); return; }
  if (s.anyOf) {
    if (!s.anyOf.some((a) => { try { validate(v, a, where); return true; } catch { return false; } })) fail("no anyOf alternative");
    return;
  }
  const type = Array.isArray(v) ? "array" : v === null ? "null" : typeof v;
  switch (s.type) {
    case "object":
      if (type !== "object") fail("not an object");
      for (const r of s.required || []) if (!(r in v)) fail(`missing ${r}`);
      for (const [k, x] of Object.entries(v)) {
        if (!(k in (s.properties || {}))) { if (s.additionalProperties === false) fail(`extra key ${k}`); continue; }
        validate(x, s.properties[k], `${where}.${k}`);
      }
      break;
    case "array":
      if (type !== "array") fail("not an array");
      if (s.minItems !== undefined && v.length < s.minItems) fail("too few items");
      if (s.maxItems !== undefined && v.length > s.maxItems) fail("too many items");
      v.forEach((x, i) => s.items && validate(x, s.items, `${where}[${i}]`));
      break;
    case "string":
      if (type !== "string") fail("not a string");
      if (s.maxLength !== undefined && [...v].length > s.maxLength) fail("too long");
      break;
    case "integer": if (!Number.isInteger(v)) fail("not an integer"); break;
    case "number": if (type !== "number") fail("not a number"); break;
    case "boolean": if (type !== "boolean") fail("not a boolean"); break;
    case "null": if (v !== null) fail("not null"); break;
  }
}

const messages = [{ role: "user", content: "Describe a person from the city as JSON." }];

test("json_schema (strict): every reply parses and validates, for seeds and temperatures", async () => {
  for (const temperature of [0, 0.8, 1.5]) {
    for (const seed of [1, 2, 3]) {
      const r = await client.chat.completions.create({ model: "demo", messages, temperature, seed, max_tokens: 600,
                                                        response_format: schemaFormat(PERSON) });
      const c = r.choices[0];
      assert.equal(c.finish_reason, "stop", `t=${temperature} seed=${seed}: ${c.message.content}`);
      validate(JSON.parse(c.message.content), PERSON);
      if (temperature === 0) break; // greedy: one is enough
    }
  }
});

test("json_schema on completions, streamed: the chunks put together are a valid value", async () => {
  const nested = { type: "object", properties: { items: { type: "array", maxItems: 2,
    items: { type: "object", properties: { id: { type: "integer" }, kind: { enum: ["a", "b"] } }, required: ["id", "kind"], additionalProperties: false } } },
    required: ["items"], additionalProperties: false };
  for (const seed of [4, 5]) {
    const stream = await client.completions.create({ model: "demo", prompt: "Here is the list:", temperature: 1, seed,
                                                     max_tokens: 400, stream: true, response_format: schemaFormat(nested) });
    let text = "", finish = null;
    for await (const ch of stream) {
      const x = ch.choices[0];
      if (!x) continue;
      text += x.text;
      if (x.finish_reason) finish = x.finish_reason;
    }
    assert.equal(finish, "stop", text);
    validate(JSON.parse(text), nested);
  }
});

test("json_object: replies that end are JSON objects; the value ends the reply", async () => {
  for (const seed of [7, 8, 9]) {
    const r = await client.chat.completions.create({ model: "demo", messages, temperature: 1, seed, max_tokens: 300,
                                                      response_format: { type: "json_object" } });
    const c = r.choices[0];
    if (c.finish_reason === "length") continue; // an unbounded object may run past max_tokens
    assert.equal(c.finish_reason, "stop");
    const v = JSON.parse(c.message.content);
    assert.ok(v && typeof v === "object" && !Array.isArray(v), c.message.content);
  }
});

test("max_tokens cuts the value short: finish_reason length", async () => {
  const r = await client.chat.completions.create({ model: "demo", messages, temperature: 0, max_tokens: 3,
                                                    response_format: schemaFormat(PERSON) });
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.usage.completion_tokens, 3);
  assert.throws(() => JSON.parse(r.choices[0].message.content));
});

test("bad response_format / schemas are 400s with a message", async () => {
  const bad = [
    [schemaFormat({ type: "string", pattern: "(a" }), /'pattern' does not compile/],
    [schemaFormat({ type: "object", properties: { a: { type: "string" } }, required: ["b"] }), /"b" is not in/],
    [schemaFormat({ $ref: "#/$defs/missing" }), /does not name/],
    [schemaFormat({ type: "string", format: "uri" }), /format "uri" is not supported/],
    [schemaFormat({ allOf: [{ type: "string" }] }), /OpenAI's strict mode refuses it too/],
    [schemaFormat({ type: "integer", minimum: 3, maximum: 2 }), /no integer/],
    [schemaFormat({ type: "widget" }), /not a JSON schema type/],
    [{ type: "xml" }, /json_object or json_schema/],
    [{ type: "json_schema" }, /json_schema/],
  ];
  for (const [response_format, re] of bad) {
    await assert.rejects(client.chat.completions.create({ model: "demo", messages, max_tokens: 4, response_format }),
      (e) => { assert.equal(e.status, 400); assert.match(e.message, re); return true; });
  }
  // the same on completions, and the OpenAI error shape
  const r = await postJSON(srv.url + "/v1/completions", { prompt: "x", response_format: schemaFormat({ type: "string", format: "uri" }) });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.type, "invalid_request_error");
  assert.equal(r.json.error.code, "invalid_json_schema");
  // not strict: the unsupported keyword is ignored, and named in system_fingerprint
  const ok = await client.chat.completions.create({ model: "demo", messages, max_tokens: 300, temperature: 0,
    response_format: schemaFormat({ type: "object", properties: { d: { type: "string", maxLength: 4, format: "uri" } },
                                    required: ["d"], additionalProperties: false, minProperties: 1 }, false) });
  assert.equal(ok.choices[0].finish_reason, "stop", ok.choices[0].message.content);
  assert.equal(typeof JSON.parse(ok.choices[0].message.content).d, "string");
  assert.equal(ok.system_fingerprint, "kvq schema-ignored=minProperties,format:uri");
});
