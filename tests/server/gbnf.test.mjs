// llama-server's top-level request fields: "grammar" (GBNF) and "json_schema", on
// /v1/completions and /v1/chat/completions. Grammars written by hand in the style of
// llama.cpp's grammars/ folder (JSON, arithmetic, a list, chess moves); every reply, at
// temperatures 0, 1 and 1.5, must be accepted by a reference parser of the same grammar
// written here. A grammar that cannot compile is a 400 naming the rule and the column.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import Ajv from "ajv";
import { startServer, postJSON } from "./lib.mjs";

let srv;
before(async () => { srv = await startServer(["-np", "4", "-c", "2048"]); });
after(async () => { assert.equal(await srv.stop(), 0); });

const G = {
  json: String.raw`root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value){0,3} )? "}" ws
array  ::= "[" ws ( value ("," ws value){0,3} )? "]" ws
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) ){0,16} "\"" ws
number ::= "-"? ("0" | [1-9] [0-9]{0,6}) ("." [0-9]{1,4})? ws
ws     ::= [ \n]{0,2}
`,
  arithmetic: String.raw`root  ::= (expr "=" ws term "\n"){1,3}
expr  ::= term ([-+*/] term){0,6}
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]{0,6} ws
num   ::= [0-9]{1,6} ws
ws    ::= [ \t]{0,2}
`,
  list: String.raw`root ::= item{1,4}
# one item a line
item ::= "- " [^\r\n\x0b\x0c\u2028\u2029]{1,30} "\n"
`,
  chess: String.raw`root ::= (
    "1. " move " " move "\n"
    ([1-9] [0-9]? ". " move " " move "\n"){1,3}
)
move    ::= (pawn | nonpawn | castle) [+#]?
pawn    ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBRQ])?
nonpawn ::= [NBRQK] [a-h]? [1-8]? "x"? [a-h] [1-8]
castle  ::= "O-O" "-O"?
`,
};

// Reference parsers of the same grammars.
const MOVE = String.raw`(?:(?:[a-h]x)?[a-h][1-8](?:=[NBRQ])?|[NBRQK][a-h]?[1-8]?x?[a-h][1-8]|O-O(?:-O)?)[+#]?`;
const PAIR = `${MOVE} ${MOVE}\\n`;
function arithmetic(t) {
  let i = 0;
  const ws = () => { while (t[i] === " " || t[i] === "\t") i++; };
  const term = () => {
    if (/[a-z]/.test(t[i] ?? "")) { while (/[a-z0-9_]/.test(t[i] ?? "")) i++; }
    else if (/[0-9]/.test(t[i] ?? "")) { while (/[0-9]/.test(t[i] ?? "")) i++; }
    else if (t[i] === "(") { i++; ws(); if (!expr() || t[i++] !== ")") return false; }
    else return false;
    ws();
    return true;
  };
  const expr = () => { if (!term()) return false; let ops = 0; while ("-+*/".includes(t[i] ?? "x")) { i++; ops++; if (!term()) return false; } return ops <= 6; };
  let lines = 0;
  while (i < t.length) {
    if (!expr() || t[i++] !== "=") return false;
    ws();
    if (!term() || t[i++] !== "\n") return false;
    lines++;
  }
  return lines >= 1 && lines <= 3;
}
const CHECK = {
  json: (t) => { const v = JSON.parse(t); return v !== null && typeof v === "object" && !Array.isArray(v); },
  arithmetic,
  list: (t) => /^(?:- [^\r\n\x0b\x0c\u2028\u2029]{1,30}\n){1,4}$/u.test(t),
  chess: (t) => new RegExp(`^1\\. ${PAIR}(?:[1-9][0-9]?\\. ${PAIR}){1,3}$`).test(t),
};

test("grammar: every reply parses under the reference parser (completions and chat, temperatures 0 / 1 / 1.5)", async () => {
  const jobs = [];
  for (const name of Object.keys(G))
    for (const [temperature, seed] of [[0, 1], [1, 2], [1.5, 3]]) {
      const chat = seed % 2 === 0;
      jobs.push((async () => {
        const body = { grammar: G[name], temperature, seed, max_tokens: 400 };
        const r = await postJSON(srv.url + (chat ? "/v1/chat/completions" : "/v1/completions"),
          chat ? { ...body, messages: [{ role: "user", content: `Write ${name}.` }] } : { ...body, prompt: `Here is ${name}:\n` });
        assert.equal(r.status, 200, r.text);
        const c = r.json.choices[0], text = chat ? c.message.content : c.text;
        assert.equal(c.finish_reason, "stop", `${name} t=${temperature}: ${text}`);
        assert.ok(CHECK[name](text), `${name} t=${temperature}: the reference parser refuses ${JSON.stringify(text)}`);
      })());
    }
  await Promise.all(jobs);
});

test("top-level json_schema (llama-server's field): replies validate", async () => {
  const schema = { type: "object", properties: { n: { type: "integer", minimum: 1, maximum: 9 }, tag: { enum: ["a", "b"] } },
                   required: ["n", "tag"], additionalProperties: false };
  const validate = new Ajv().compile(schema);
  for (const seed of [1, 2]) {
    const r = await postJSON(srv.url + "/v1/completions", { prompt: "JSON:", json_schema: schema, temperature: 1, seed, max_tokens: 100 });
    assert.equal(r.status, 200, r.text);
    assert.ok(validate(JSON.parse(r.json.choices[0].text)), r.json.choices[0].text);
  }
});

test("a grammar that cannot compile is a 400 naming the rule and the column", async () => {
  const bad = [
    ['root ::= item\nitem ::= "a" (b | "c"\n', /rule 'item', line 3 column 1: '\)' expected/],
    ['root ::= "a" nope\n', /rule 'nope', line 1 column 14: used but not defined/],
    ['root ::= root "a"\n', /rule 'root', line 1 column 1: left-recursive/],
    ['root ::= [a-z\n', /rule 'root', line 2 column 1: the text ends inside a literal or class/],
  ];
  for (const [grammar, re] of bad) {
    const r = await postJSON(srv.url + "/v1/completions", { prompt: "x", grammar, max_tokens: 4 });
    assert.equal(r.status, 400, grammar);
    assert.equal(r.json.error.code, "invalid_grammar");
    assert.match(r.json.error.message, re);
  }
  const both = await postJSON(srv.url + "/v1/completions", { prompt: "x", grammar: G.list, response_format: { type: "json_object" } });
  assert.equal(both.status, 400);
});
