// More streams than one forward computes exactly (kvq_model_exact_rows: 16 on the CPU): 18
// greedy requests at once on -np 18, each reply's text and token logprobs (every bit) equal to
// the same request alone. The server splits a step's decode rows into forwards of at most 16
// rows; one forward of 17 or more takes the batched kernels, whose logits differ in the last bits.
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startServer, sleep } from "./lib.mjs";

const PROMPTS = ["The jury said", "It was a bright cold day", "Mr. Johnson told the committee", "In the spring of that year",
                 "The city council voted", "She looked at the", "Baseball is a game of", "The President of the United States",
                 "The new school", "He said that the", "After the war", "The money was", "On Sunday the church",
                 "The state highway department", "Their plan was to", "The weather in Atlanta", "A small boy",
                 "The governor asked"];
const N_TOKENS = 40;
const ask = (prompt) => ({ model: "demo", prompt, max_tokens: N_TOKENS, temperature: 0, logprobs: 1 });
const reply = (r) => ({ text: r.choices[0].text, lp: r.choices[0].logprobs.token_logprobs, finish: r.choices[0].finish_reason });

test("18 streams on -np 18: each reply and its logprobs equal the request's alone", async () => {
  const srv = await startServer(["-np", String(PROMPTS.length), "-c", "128"]);
  try {
    const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
    const alone = [];
    for (const p of PROMPTS) alone.push(reply(await client.completions.create(ask(p))));
    // every reply runs its full length, so the last prompt read still finds the others decoding
    for (const a of alone) assert.equal(a.finish, "length");
    let maxBusy = 0, polling = true;
    const poll = (async () => {
      while (polling) {
        maxBusy = Math.max(maxBusy, (await (await fetch(srv.url + "/health")).json()).slots_processing);
        await sleep(2);
      }
    })();
    const together = (await Promise.all(PROMPTS.map((p) => client.completions.create(ask(p))))).map(reply);
    polling = false;
    await poll;
    assert.equal(maxBusy, PROMPTS.length, "all slots busy at once");
    for (let i = 0; i < PROMPTS.length; i++) assert.deepEqual(together[i], alone[i], "stream " + i + " (" + PROMPTS[i] + ")");
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});
