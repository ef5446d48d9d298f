// Speculative decoding in kvq-server on the Vulkan backend (lavapipe in CI): the drafts of a
// step are verified in its one batched forward there too, and greedy replies are token for
// token those of a Vulkan server without drafts (--lookup and --draft, f16 and q4 caches,
// two streams at once). Skipped when no Vulkan device starts.
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startServer, MODEL } from "./lib.mjs";

const DOC = "The jury said that the city of Atlanta should take steps to improve its election laws. " +
  "The grand jury commented on a number of other topics, among them the purchasing departments of the city. ";
const ASKS = [
  { prompt: DOC + DOC + "The jury", max_tokens: 32 },
  { prompt: "It was a cold morning in the mountains, and the", max_tokens: 24 },
  { prompt: DOC + DOC + "The city", max_tokens: 32, stop: ["election"] },
];
const req = (a) => ({ model: "demo", temperature: 0, ...a });

// each ask alone, then the first and last at once (2 slots); texts and drafted/accepted counts
async function replies(args) {
  const srv = await startServer(["-c", "512", "-np", "2", "--backend", "vulkan", ...args]);
  try {
    const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
    const out = [];
    let drafted = 0, accepted = 0;
    const take = (r) => {
      drafted += r.timings.draft_n;
      accepted += r.timings.draft_n_accepted;
      return r.choices[0].text + "|" + r.choices[0].finish_reason;
    };
    for (const a of ASKS) out.push(take(await client.completions.create(req(a))));
    const both = await Promise.all([ASKS[0], ASKS[2]].map((a) => client.completions.create(req(a))));
    out.push(...both.map(take));
    return { out, drafted, accepted, err: srv.stderr() };
  } finally {
    assert.equal(await srv.stop(), 0);
  }
}

let plain = null, skip = false;
try {
  plain = await replies([]);
} catch (e) {
  if (!/vulkan/i.test(String(e.message))) throw e;
  skip = "no Vulkan device";
}

for (const [name, args] of [["--lookup 2", ["--lookup", "2"]], ["--draft (itself)", ["--draft", MODEL, "--draft-max", "4"]]]) {
  test(`Vulkan, ${name}: greedy replies equal the plain Vulkan server's; drafts verified`, { skip }, async () => {
    const got = await replies(args);
    assert.doesNotMatch(got.err, /CPU-only|ignored/);
    assert.deepEqual(got.out, plain.out);
    assert.ok(got.drafted > 0 && got.accepted > 0, `drafted ${got.drafted}, accepted ${got.accepted}`);
  });
}

test("Vulkan, --lookup 2 on a q4 cache: greedy replies equal the plain q4 server's", { skip }, async () => {
  const q4 = ["-ctk", "q4", "-ctv", "q4"];
  const base = await replies(q4), got = await replies([...q4, "--lookup", "2"]);
  // one at a time: two at once differ run to run on a plain q4 server too (which slot's cached prefix)
  assert.deepEqual(got.out.slice(0, ASKS.length), base.out.slice(0, ASKS.length));
  assert.ok(got.drafted > 0 && got.accepted > 0);
});
