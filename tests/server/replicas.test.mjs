// deploy/nginx/kvq-replicas.conf as shipped (only its ports changed): nginx in front of two
// kvq-server replicas. Conversations with an X-Session-Id come back to the replica holding their
// prefix; with one replica killed mid-run every request is still answered (retried on the other).
// KVQ_NGINX (set by ctest when nginx is installed) is the nginx binary.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";
import { startServer } from "./lib.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const conf = path.join(here, "..", "..", "deploy", "nginx", "kvq-replicas.conf");
let a, b, nginx, base, prefix;

async function freePort() {
  const s = net.createServer();
  s.listen(0, "127.0.0.1");
  await once(s, "listening");
  const port = s.address().port;
  s.close();
  await once(s, "close");
  return port;
}

before(async () => {
  // slow steps keep requests in flight long enough to kill a replica under them
  const args = ["-np", "8", "-c", "512"]; // room for every conversation on either replica
  const env = { KVQ_SERVER_STEP_MS: "15" };
  [a, b] = await Promise.all([startServer(args, { env }), startServer(args, { env })]);
  const port = await freePort();
  prefix = fs.mkdtempSync(path.join(os.tmpdir(), "kvq-nginx-"));
  fs.mkdirSync(path.join(prefix, "tmp"));
  const text = fs.readFileSync(conf, "utf8");
  assert.ok(text.includes("127.0.0.1:8080;") && text.includes(":8081 ") && text.includes(":8082 "), "the shipped ports");
  fs.writeFileSync(path.join(prefix, "kvq.conf"),
    text.replaceAll("127.0.0.1:8080;", `127.0.0.1:${port};`).replaceAll(":8081 ", `:${a.port} `).replaceAll(":8082 ", `:${b.port} `));
  nginx = spawn(process.env.KVQ_NGINX || "nginx", ["-p", prefix, "-c", "kvq.conf", "-e", path.join(prefix, "error.log")],
                { stdio: ["ignore", "inherit", "inherit"] });
  base = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) { // up when /health answers through it
    try { if ((await fetch(base + "/health")).ok) break; } catch (e) {}
    if (i > 100) throw new Error("nginx did not come up: " + fs.readFileSync(path.join(prefix, "error.log"), "utf8"));
    await new Promise((r) => setTimeout(r, 100));
  }
});

after(async () => {
  if (nginx && nginx.exitCode === null) { nginx.kill("SIGQUIT"); await once(nginx, "exit"); }
  await Promise.all([a.stop(), b.stop()]);
});

const client = (session) => new OpenAI({ baseURL: base + "/v1", apiKey: "none", maxRetries: 0,
                                         defaultHeaders: session ? { "X-Session-Id": session } : {} });

test("a conversation's next turn lands on the replica holding its prefix", async () => {
  // one after the other, so least_conn alone would alternate the replicas: the extra request
  // between the rounds shifts that alternation, and every second turn would miss its prefix
  const turn = (c, msgs) => c.chat.completions.create({ model: "demo", messages: msgs, max_tokens: 8, temperature: 0 });
  const convs = [];
  for (let i = 0; i < 6; i++) {
    const c = client(`conversation-${i}`);
    const msgs = [{ role: "user", content: `Conversation ${i}: the jury said that the city of Atlanta` }];
    const r1 = await turn(c, msgs);
    msgs.push({ role: "assistant", content: r1.choices[0].message.content }, { role: "user", content: "and then?" });
    convs.push({ c, msgs, r1 });
  }
  await client(null).completions.create({ model: "demo", prompt: "shift", max_tokens: 1 });
  for (const [i, { c, msgs, r1 }] of convs.entries()) {
    const r2 = await turn(c, msgs);
    assert.ok(r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 1,
              `conversation ${i}: turn 2 cached ${r2.usage.prompt_tokens_details.cached_tokens} of turn 1's ${r1.usage.prompt_tokens} prompt tokens`);
  }
});

test("a replica killed mid-run: every request is answered by the other", async () => {
  const c = client(null);
  const before = await (await fetch(a.url + "/metrics")).text();
  const jobs = Array.from({ length: 16 }, (_, i) =>
    c.completions.create({ model: "demo", prompt: `Request ${i}: The jury said`, max_tokens: 48, temperature: 0 }));
  await new Promise((r) => setTimeout(r, 400));
  const busy = Number((await (await fetch(a.url + "/metrics")).text()).match(/^kvq_slots_busy (\S+)$/m)?.[1] ?? NaN);
  assert.ok(busy > 0, `replica A is working when it is killed (busy slots ${busy}; before: ${before.length} bytes of metrics)`);
  a.proc.kill("SIGKILL");
  const answers = await Promise.all(jobs);
  for (const r of answers) {
    assert.equal(r.choices.length, 1);
    assert.ok(r.choices[0].text.length > 0, "an answer with text");
  }
  // and after it: the survivor takes everything
  const r = await c.completions.create({ model: "demo", prompt: "After: The jury said", max_tokens: 4, temperature: 0 });
  assert.ok(r.choices[0].text.length > 0);
});
