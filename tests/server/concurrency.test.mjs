// Slots and the queue: 8 concurrent streams on -np 4 each equal their greedy
// reply alone; beyond slots + queue a 503 with Retry-After; a client that goes
// away frees its slot within a step.
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startServer, postJSON, metric, sleep } from "./lib.mjs";

const PROMPTS = ["The jury said", "It was a bright cold day", "Mr. Johnson told the committee", "In the spring of that year",
                 "The city council voted", "She looked at the", "Baseball is a game of", "The President of the United States"];

async function collect(client, prompt, max_tokens) {
  const stream = await client.completions.create({ model: "demo", prompt, max_tokens, temperature: 0, stream: true });
  let text = "";
  for await (const ch of stream) text += ch.choices[0] ? ch.choices[0].text : "";
  return text;
}

test("8 concurrent streams on -np 4: each equals its reply alone, the rest queue", async () => {
  const srv = await startServer(["-np", "4", "-c", "256", "--queue", "8"]);
  try {
    const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
    const alone = [];
    for (const p of PROMPTS) alone.push(await collect(client, p, 40));
    let maxBusy = 0, maxQueued = 0, polling = true;
    const poll = (async () => {
      while (polling) {
        const h = await (await fetch(srv.url + "/health")).json();
        maxBusy = Math.max(maxBusy, h.slots_processing);
        maxQueued = Math.max(maxQueued, h.queued);
        await sleep(5);
      }
    })();
    const queuedBefore = await metric(srv.url, "requests_queued_total");
    const together = await Promise.all(PROMPTS.map((p) => collect(client, p, 40)));
    polling = false;
    await poll;
    for (let i = 0; i < PROMPTS.length; i++) assert.equal(together[i], alone[i], "stream " + i + " (" + PROMPTS[i] + ")");
    assert.ok(maxBusy <= 4, "never more than 4 busy slots");
    assert.equal(maxBusy, 4, "all 4 slots busy at once");
    const queued = (await metric(srv.url, "requests_queued_total")) - queuedBefore;
    assert.ok(queued >= 1 || maxQueued >= 1, "requests beyond 4 waited in the queue");
    const h = await (await fetch(srv.url + "/health")).json();
    assert.equal(h.slots_idle, 4);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test("queue full: 503 with Retry-After and an error object, then served again", async () => {
  const srv = await startServer(["-np", "1", "-c", "1024", "--queue", "0"]);
  try {
    const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
    const ac = new AbortController();
    const stream = await client.completions.create({ model: "demo", prompt: "The jury said", max_tokens: 1000, stream: true },
                                                   { signal: ac.signal });
    const it = stream[Symbol.asyncIterator]();
    await it.next(); // the slot is taken
    const r = await postJSON(srv.url + "/v1/completions", { prompt: "Hello", max_tokens: 2 });
    assert.equal(r.status, 503);
    assert.equal(r.headers.get("retry-after"), "1");
    assert.equal(typeof r.json.error.message, "string");
    ac.abort();
    await it.return?.().catch(() => {});
    // the slot frees within a step; then requests are served
    let ok = null;
    for (let i = 0; i < 100 && !ok; i++) {
      const q = await postJSON(srv.url + "/v1/completions", { prompt: "Hello", max_tokens: 2 });
      if (q.status === 200) ok = q;
      else await sleep(20);
    }
    assert.ok(ok, "served after the stream was cut");
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test("a client that disconnects frees its slot", async () => {
  const srv = await startServer(["-np", "1", "-c", "1024"]);
  try {
    const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
    for (const stream of [true, false]) {
      const ac = new AbortController();
      const before = await metric(srv.url, "client_disconnects_total");
      const p = client.completions.create({ model: "demo", prompt: "The jury said", max_tokens: 1000, stream }, { signal: ac.signal });
      if (stream) await (await p)[Symbol.asyncIterator]().next();
      else {
        p.catch(() => {});
        for (let i = 0; i < 200 && (await (await fetch(srv.url + "/health")).json()).slots_processing === 0; i++) await sleep(5);
      }
      ac.abort();
      // the slot is free again long before 1000 tokens could have been generated
      const t0 = Date.now();
      let h;
      for (;;) {
        h = await (await fetch(srv.url + "/health")).json();
        if (h.slots_idle === 1 || Date.now() - t0 > 3000) break;
        await sleep(10);
      }
      assert.equal(h.slots_idle, 1, (stream ? "streamed" : "not streamed") + ": slot freed");
      assert.equal(await metric(srv.url, "client_disconnects_total"), before + 1);
      const gen = await metric(srv.url, "generated_tokens_total");
      assert.ok(gen < 900 * (stream ? 1 : 2), "generation stopped early: " + gen);
    }
    const c = await client.completions.create({ model: "demo", prompt: "Hello", max_tokens: 3 });
    assert.ok(c.usage.completion_tokens > 0);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test("a long prompt is read in chunks between decode steps: a running stream keeps going", async () => {
  const srv = await startServer(["-np", "2", "-c", "1024", "--chunk", "32"]);
  try {
    const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 });
    const times = [];
    const running = (async () => {
      const s = await client.completions.create({ model: "demo", prompt: "The jury said", max_tokens: 400, temperature: 0,
                                                 stream: true, stream_options: { include_usage: true } });
      for await (const ch of s) if (ch.choices[0]?.text) times.push(performance.now());
    })();
    while (times.length < 3) await sleep(5);
    // ~700 prompt tokens: 22 chunks of 32, one per step, each step also decoding the running stream
    const long = "word ".repeat(700);
    const t0 = performance.now();
    const s = await client.completions.create({ model: "demo", prompt: long, max_tokens: 1, stream: true });
    let tFirst = 0;
    for await (const ch of s) if (!tFirst && ch.choices[0]) tFirst = performance.now();
    await running;
    const during = times.filter((t) => t > t0 && t < tFirst).length;
    assert.ok(during >= 10, `the running stream produced ${during} tokens while the long prompt was read`);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

// Other requests' prompts read while a greedy stream decodes (each past 16 rows, on a q4 cache,
// which shows rounding most) leave its reply as it is alone: the step keeps decode rows and a
// prompt chunk in separate forwards. Mixed, "Baseball is a game of" changed from 1960 to 1961.
const DOC = "The jury said that the city of Atlanta should take steps to improve its election laws. " +
  "The grand jury commented on a number of other topics, among them the purchasing departments of the city. ";
const BESIDE = ["The city. ", "In the spring, ", "Mr. Johnson said: ", "Yesterday ", "At noon "].map((s) => s + DOC + DOC);
test("a greedy stream on a q4 cache equals its reply alone while other prompts are read beside it", async () => {
  const q4 = ["-np", "2", "-c", "512", "-ctk", "q4", "-ctv", "q4"];
  const run = async (fn) => {
    const srv = await startServer(q4);
    try {
      return await fn(new OpenAI({ baseURL: srv.url + "/v1", apiKey: "none", maxRetries: 0 }));
    } finally {
      assert.equal(await srv.stop(), 0);
    }
  };
  for (const p of ["Baseball is a game of", ...PROMPTS.slice(0, 5)]) {
    const alone = await run((client) => collect(client, p, 48));
    const beside = await run(async (client) => {
      const s = await client.completions.create({ model: "demo", prompt: p, max_tokens: 48, temperature: 0, stream: true });
      let text = "", read = null;
      for await (const ch of s) {
        text += ch.choices[0] ? ch.choices[0].text : "";
        // after the first token: the other prompts, one after another, on the second slot
        read ??= (async () => {
          for (const b of BESIDE) await client.completions.create({ model: "demo", prompt: b, max_tokens: 1 });
        })();
      }
      await read;
      return text;
    });
    assert.equal(beside, alone, p);
  }
});
