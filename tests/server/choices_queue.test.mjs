// n > 1 in the queue: a request's choices take slots one by one as they come free, so a
// waiting n = 2 request holds back neither its own first choice nor the single requests
// behind it while a slot is idle; a choice that starts while choice 0 is already generating
// still equals the choice of an unhurried run; a stream of single requests does not starve it.
// KVQ_SERVER_STEP_MS slows each step so the long request surely outlasts the short ones.
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startServer, metric, sleep } from "./lib.mjs";

const env = { KVQ_SERVER_STEP_MS: "10" };

// A streamed completion read in the background: { first, done } resolve at its first chunk
// and its end (with the choices' texts by index and the time it ended).
function streamed(client, req, signal) {
  let gotFirst;
  const first = new Promise((r) => { gotFirst = r; });
  const done = (async () => {
    const texts = [];
    try {
      const s = await client.completions.create({ ...req, stream: true }, { signal });
      for await (const ch of s) {
        for (const c of ch.choices) {
          texts[c.index] = (texts[c.index] || "") + c.text;
          if (c.text) gotFirst(Date.now());
        }
      }
    } catch (e) {
      if (!signal || !signal.aborted) throw e;
    }
    gotFirst(Infinity);
    return { texts, at: Date.now() };
  })();
  return { first, done };
}

const prompt = "The jury said that the city of Atlanta should take steps to improve its";

test("2 slots, one busy: an n = 2 request starts choice 0 at once, a later single runs before the long one ends", async () => {
  const srv = await startServer(["-np", "2", "-c", "512"], { env });
  try {
    const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
    const ac = new AbortController();
    const long = streamed(client, { model: "demo", prompt: "It was a bright cold day", max_tokens: 400, temperature: 0 }, ac.signal);
    await long.first; // slot 0 is taken for about 4 s
    const group = streamed(client, { model: "demo", prompt, max_tokens: 8, temperature: 1.0, seed: 5, n: 2 });
    await sleep(30); // the n = 2 request is queued first
    const single = streamed(client, { model: "demo", prompt: "The city council voted", max_tokens: 6, temperature: 0 });
    const [g, s] = await Promise.all([group.done, single.done]);
    const longEnd = await Promise.race([long.done.then((r) => r.at), sleep(0).then(() => Infinity)]);
    assert.equal(longEnd, Infinity, "the long request is still running");
    assert.equal(g.texts.length, 2, "two choices");
    for (const t of g.texts) assert.ok(t && t.length > 0, "each choice has text: " + JSON.stringify(g.texts));
    assert.ok(s.texts[0] && s.texts[0].length > 0, "the single request has text");
    ac.abort();
    await long.done;
    // the same request on idle slots: the choices do not depend on when each got its slot
    const alone = await client.completions.create({ model: "demo", prompt, max_tokens: 8, temperature: 1.0, seed: 5, n: 2 });
    assert.deepEqual(g.texts, alone.choices.map((c) => c.text));
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test("a choice that starts while choice 0 generates takes its cache, cut back to the prompt", async () => {
  const srv = await startServer(["-np", "3", "-c", "512"], { env });
  try {
    const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
    const cachedBefore = await metric(srv.url, "prompt_tokens_cached_total"); // fresh slots: nothing cached below
    const ac = new AbortController();
    const long = streamed(client, { model: "demo", prompt: "It was a bright cold day", max_tokens: 400, temperature: 0 }, ac.signal);
    const short = streamed(client, { model: "demo", prompt: "The city council voted", max_tokens: 30, temperature: 0 });
    await Promise.all([long.first, short.first]);
    const req = { model: "demo", prompt, max_tokens: 60, temperature: 1.0, seed: 9, n: 2 };
    const group = streamed(client, req); // choice 0 takes the idle slot, choice 1 the short one's
    const g0 = await group.first;
    const shortEnd = (await short.done).at;
    assert.ok(g0 < shortEnd, "choice 0 streamed before the short request freed a slot");
    const g = await group.done;
    const cached = (await metric(srv.url, "prompt_tokens_cached_total")) - cachedBefore;
    ac.abort();
    await long.done;
    assert.equal(g.texts.length, 2);
    const alone = await client.completions.create(req);
    assert.deepEqual(g.texts, alone.choices.map((c) => c.text), "a late choice equals the one started with choice 0");
    const n_prompt = alone.usage.prompt_tokens;
    assert.ok(cached >= n_prompt, `choice 1 took the prompt from choice 0's cache (${cached} cached of ${n_prompt})`);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test("a steady stream of single requests does not starve an n = 2 request", async () => {
  const srv = await startServer(["-np", "2", "-c", "512"], { env });
  try {
    const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
    let pumping = true, singles = 0;
    const pump = async (p) => { // keeps one single request running or queued at all times
      while (pumping) {
        await client.completions.create({ model: "demo", prompt: p, max_tokens: 10, temperature: 0 });
        singles++;
      }
    };
    const pumps = [pump("The jury said"), pump("She looked at the"), pump("Baseball is a game of")];
    await sleep(200);
    const t0 = Date.now();
    const r = await client.completions.create({ model: "demo", prompt, max_tokens: 8, temperature: 0, n: 2 });
    const waited = Date.now() - t0;
    const during = singles;
    pumping = false;
    await Promise.all(pumps);
    assert.equal(r.choices.length, 2);
    for (const c of r.choices) assert.ok(c.text.length > 0);
    assert.ok(during > 0, "single requests ran meanwhile");
    assert.ok(waited < 10000, `the n = 2 request waited ${waited} ms`);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});
