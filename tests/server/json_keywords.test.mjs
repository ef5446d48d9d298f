// Strict json_schema with the value keywords clients built on zod / pydantic send (number
// bounds, multipleOf, pattern, the nine formats, anyOf alternatives that begin alike), through
// the official openai client. Every reply, at temperatures 0, 1 and 1.5 over several seeds, on
// the CPU and with a draft model, must end ("stop"), parse, be validated by ajv + ajv-formats
// (a validator that is not kvq's) and be written compactly (no blank outside strings).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import Ajv from "ajv";
import addFormats from "ajv-formats";
import { startServer, postJSON, MODEL } from "./lib.mjs";

let plain, drafted;
before(async () => {
  [plain, drafted] = await Promise.all([
    startServer(["-np", "2", "-c", "2048"]),
    startServer(["-np", "1", "-c", "2048", "--draft", MODEL, "--draft-max", "4"]),
  ]);
});
after(async () => {
  assert.equal(await plain.stop(), 0);
  assert.equal(await drafted.stop(), 0);
});
const client = (s) => new OpenAI({ baseURL: s.url + "/v1", apiKey: "none", maxRetries: 0 });

const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

const str = (extra) => ({ type: "string", ...extra });
const SCHEMA = {
  type: "object",
  properties: {
    age: { type: "integer", minimum: 0, maximum: 150 },
    delta: { type: "integer", minimum: -1000, maximum: -100, multipleOf: 25 },
    temp: { type: "number", exclusiveMinimum: -40, exclusiveMaximum: 60.5 },
    price: { type: "number", minimum: 0, maximum: 100, multipleOf: 0.25 },
    sku: str({ pattern: "^[A-Z]{3}-[0-9]{2,4}$" }),
    when: str({ format: "date-time" }),
    day: str({ format: "date" }),
    at: str({ format: "time" }),
    took: str({ format: "duration" }),
    mail: str({ format: "email" }),
    host: str({ format: "hostname" }),
    ip4: str({ format: "ipv4" }),
    ip6: str({ format: "ipv6" }),
    id: str({ format: "uuid" }),
    nick: str({ minLength: 2, maxLength: 6 }),
    shape: {
      anyOf: [
        { type: "object", properties: { kind: { const: "circle" }, r: { type: "number", minimum: 0, maximum: 10 } },
          required: ["kind", "r"], additionalProperties: false },
        { type: "object", properties: { kind: { const: "square" }, side: { type: "integer", minimum: 1, maximum: 9 } },
          required: ["kind", "side"], additionalProperties: false },
      ],
    },
    fruit: { anyOf: [{ enum: ["apple", "apricot"] }, { enum: ["april", "apple pie"] }, { type: "null" }] },
  },
  additionalProperties: false,
};
SCHEMA.required = Object.keys(SCHEMA.properties);
const validate = ajv.compile(SCHEMA);
const rf = (schema) => ({ type: "json_schema", json_schema: { name: "record", strict: true, schema } });
const messages = [{ role: "user", content: "Write one record as JSON." }];

// No blank outside strings: the compact layout.
function compact(text) {
  let inStr = false, esc = false;
  for (const ch of text) {
    if (inStr) { if (esc) esc = false; else if (ch === "\\") esc = true; else if (ch === '"') inStr = false; }
    else if (ch === '"') inStr = true;
    else if (" \n\r\t".includes(ch)) return false;
  }
  return true;
}

async function check(s, temperature, seed) {
  const r = await client(s).chat.completions.create({ model: "demo", messages, temperature, seed, max_tokens: 900,
                                                       response_format: rf(SCHEMA) });
  const c = r.choices[0], where = `t=${temperature} seed=${seed}: ${c.message.content}`;
  assert.equal(c.finish_reason, "stop", where);
  const v = JSON.parse(c.message.content);
  assert.ok(validate(v), `${where}\n${ajv.errorsText(validate.errors)}`);
  assert.ok(compact(c.message.content), where);
  assert.equal(r.system_fingerprint, "kvq");
}

test("strict keywords: ajv accepts every reply, temperatures 0 / 1 / 1.5, several seeds", async () => {
  const runs = [[0, 1], [1, 1], [1, 2], [1.5, 1], [1.5, 2]];
  await Promise.all([0, 1].map(async (lane) => {
    for (const [t, seed] of runs.filter((_, i) => i % 2 === lane)) await check(plain, t, seed);
  }));
});

test("strict keywords with a draft model: the same holds", async () => {
  for (const [t, seed] of [[1, 4]]) await check(drafted, t, seed);
});

test("kvq_layout pretty allows blanks; a bad layout is a 400", async () => {
  const small = { type: "object", properties: { n: { type: "integer", minimum: 1, maximum: 9 } }, required: ["n"],
                  additionalProperties: false };
  const r = await postJSON(plain.url + "/v1/chat/completions", { messages, max_tokens: 200, temperature: 1, seed: 3,
    kvq_layout: "pretty", response_format: rf(small) });
  assert.equal(r.status, 200, r.text);
  const n = JSON.parse(r.json.choices[0].message.content).n;
  assert.ok(Number.isInteger(n) && n >= 1 && n <= 9, r.text);
  const bad = await postJSON(plain.url + "/v1/chat/completions", { messages, kvq_layout: "wide", response_format: rf(small) });
  assert.equal(bad.status, 400);
  assert.match(bad.json.error.message, /kvq_layout/);
});

test("strict refusals name their reason; non-strict names what it ignored", async () => {
  const refused = [
    [{ type: "object", properties: { a: { type: "string" } }, allOf: [] }, /allOf.*OpenAI's strict mode refuses it too/],
    [{ type: "object", properties: { a: { type: "array", uniqueItems: true } } }, /uniqueItems/],
    [{ type: "object", properties: { a: { type: "string", format: "uri" } } }, /format "uri"/],
    [{ type: "object", properties: { a: { type: "integer", minimum: 5, exclusiveMaximum: 5 } } }, /no integer/],
  ];
  for (const [schema, re] of refused) {
    const r = await postJSON(plain.url + "/v1/chat/completions", { messages, response_format: rf(schema) });
    assert.equal(r.status, 400, JSON.stringify(schema));
    assert.match(r.json.error.message, re);
  }
  const loose = { type: "object", properties: { a: { type: "string", maxLength: 3, format: "uri" } }, required: ["a"],
                  additionalProperties: false, minProperties: 1 };
  const r = await client(plain).chat.completions.create({ model: "demo", messages, max_tokens: 100, temperature: 0,
    response_format: { type: "json_schema", json_schema: { name: "x", strict: false, schema: loose } } });
  assert.equal(r.system_fingerprint, "kvq schema-ignored=minProperties,format:uri");
});
