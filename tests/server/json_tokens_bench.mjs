// Tokens a structured reply spends over the tokens of the same value written compactly
// (JSON.stringify), on the demo model at temperature 1 over 20 seeds, for flat, nested, array,
// enum schemas and a forced tool call's arguments (Qwen2.5's call format). A benchmark, not a
// test: it prints the ratios and the replies cut by max_tokens.
//   node tests/server/json_tokens_bench.mjs [--layout compact|pretty] [--seeds N]
// Environment: KVQ_SERVER (default build/kvq-server), KVQ_MODEL (default models/demo).
import path from "node:path";

const here = path.dirname(new URL(import.meta.url).pathname);
process.env.KVQ_SERVER ||= path.join(here, "..", "..", "build", "kvq-server");
process.env.KVQ_MODEL ||= path.join(here, "..", "..", "models", "demo");
const arg = (name, def) => { const i = process.argv.indexOf(name); return i > 0 ? process.argv[i + 1] : def; };
const layout = arg("--layout", "compact"), seeds = Number(arg("--seeds", 20));
// lib.mjs reads the environment when it loads: imported after it is set
const { startServer, postJSON } = await import("./lib.mjs");
const { demoWith, removeDemoDirs } = await import("./templates.mjs");

const obj = (properties) => ({ type: "object", properties, required: Object.keys(properties), additionalProperties: false });
const SCHEMAS = {
  flat: obj({ name: { type: "string", maxLength: 20 }, age: { type: "integer", minimum: 0, maximum: 120 },
              city: { type: "string", maxLength: 16 }, active: { type: "boolean" } }),
  nested: obj({ user: obj({ name: { type: "string", maxLength: 12 },
                            address: obj({ city: { type: "string", maxLength: 12 }, zip: { type: "string", pattern: "^[0-9]{5}$" } }) }),
                score: { type: "number", minimum: 0, maximum: 10 } }),
  arrays: obj({ tags: { type: "array", items: { type: "string", maxLength: 8 }, minItems: 1, maxItems: 5 },
                scores: { type: "array", items: { type: "integer", minimum: 0, maximum: 100 }, maxItems: 4 } }),
  enums: obj({ color: { enum: ["red", "green", "blue", "yellow"] }, size: { enum: ["S", "M", "L", "XL"] },
               status: { anyOf: [{ enum: ["open", "closed"] }, { type: "null" }] } }),
};
const TOOL = { type: "function", function: { name: "book", description: "Book a stay",
  parameters: obj({ city: { type: "string", maxLength: 12 }, nights: { type: "integer", minimum: 1, maximum: 14 },
                    room: { enum: ["single", "double", "suite"] } }) } };
const messages = [{ role: "user", content: "Give me the data as JSON." }];

const srv = await startServer(["-np", "4", "-c", "4096"], { model: demoWith("qwen2.5-7b-instruct") });
const ntok = async (text) => (await postJSON(srv.url + "/tokenize", { content: text, add_special: false })).json.tokens.length;

async function one(kind, seed) {
  const body = { messages, temperature: 1, seed, max_tokens: 400, kvq_layout: layout };
  if (kind === "tool args") Object.assign(body, { tools: [TOOL], tool_choice: "required" });
  else body.response_format = { type: "json_schema", json_schema: { name: kind, strict: true, schema: SCHEMAS[kind] } };
  const r = await postJSON(srv.url + "/v1/chat/completions", body);
  if (r.status !== 200) throw new Error(r.text);
  const c = r.json.choices[0], used = r.json.usage.completion_tokens;
  if (c.finish_reason === "length") return { cut: true };
  if (kind === "tool args") { // generated: the arguments and the call's closing
    const args = JSON.stringify(JSON.parse(c.message.tool_calls[0].function.arguments));
    return { ratio: used / (await ntok(args + "}\n</tool_call>")) };
  }
  return { ratio: used / (await ntok(JSON.stringify(JSON.parse(c.message.content)))) };
}

const all = [];
console.log(`layout ${layout}, temperature 1, ${seeds} seeds, demo model (Qwen2.5's template)`);
for (const kind of [...Object.keys(SCHEMAS), "tool args"]) {
  const res = await Promise.all(Array.from({ length: seeds }, (_, i) => one(kind, i + 1)));
  const ratios = res.filter((x) => !x.cut).map((x) => x.ratio), cut = res.length - ratios.length;
  all.push(...ratios);
  const mean = ratios.reduce((a, b) => a + b, 0) / (ratios.length || 1);
  console.log(`${kind.padEnd(10)} mean ${mean.toFixed(3)}  max ${Math.max(...ratios).toFixed(3)}  cut by max_tokens ${cut}`);
}
console.log(`all        mean ${(all.reduce((a, b) => a + b, 0) / all.length).toFixed(3)} over ${all.length} replies`);
await srv.stop();
removeDemoDirs();
