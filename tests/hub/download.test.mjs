// kvq's -m ORG/NAME against the local hub: a download and load, resuming after a cut, the
// sha256 check, offline use, two processes at once, --plan, and every one-line error.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { spawn } from "node:child_process";
import { hubWithRepos, tmpHome, repoDir, run, chatArgs, DEMO, HAVE_SHARDED, ROOT, BUILD } from "./lib.mjs";

let hub, demoRef;
const SIZE = fs.statSync(path.join(DEMO, "model.safetensors")).size;
const WEIGHTS = "kvq-test/demo/model.safetensors";

before(async () => {
  hub = await hubWithRepos();
  demoRef = await run("kvq-chat", chatArgs(DEMO), {}); // the same model from its directory
  assert.equal(demoRef.code, 0, demoRef.stderr);
});
after(() => hub.close());

function assertOneLine(r, re) {
  assert.notEqual(r.code, 0, "fails");
  const lines = r.stderr.trim().split("\n");
  assert.match(lines.at(-1), re);
}

function blobs(home, id = "kvq-test/demo") {
  const d = path.join(repoDir(home, id), "blobs");
  return fs.existsSync(d) ? fs.readdirSync(d) : [];
}

test("a download from an empty cache loads and answers as the directory does", async () => {
  hub.reset();
  const home = tmpHome("full");
  const r = await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub });
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout, demoRef.stdout);
  assert.equal(hub.served[WEIGHTS], SIZE, "the weights once");
  assert.match(r.stderr, /model\.safetensors: 32\.2 MiB in .*sha256 checked/);
  const repo = repoDir(home, "kvq-test/demo");
  const commit = fs.readFileSync(path.join(repo, "refs/main"), "utf8");
  assert.match(commit, /^[0-9a-f]{40}$/);
  assert.equal(commit, hub.repos.get("kvq-test/demo").commit);
  const snap = path.join(repo, "snapshots", commit);
  for (const f of ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]) {
    const link = fs.readlinkSync(path.join(snap, f));
    assert.match(link, /^\.\.\/\.\.\/blobs\/[0-9a-f]{40,64}$/, f);
    assert.deepEqual(fs.readFileSync(path.join(snap, f)), fs.readFileSync(path.join(DEMO, f)));
  }
  assert.ok(fs.existsSync(path.join(repo, ".no_exist", commit, "generation_config.json")), "an optional 404 is remembered");
  assert.ok(!blobs(home).some((b) => b.endsWith(".incomplete")));
  // a second run is served by the cache alone
  hub.reset();
  const again = await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub });
  assert.equal(again.code, 0, again.stderr);
  assert.deepEqual(hub.requests, []);
});

test("a sharded model: the index's shards, and -hf as the flag", { skip: !HAVE_SHARDED && "no sharded fixture in ../shared" }, async () => {
  hub.reset();
  const home = tmpHome("shards");
  const r = await run("kvq-ppl", ["-hf", "kvq-test/sharded", "-f", path.join(DEMO, "config.json"), "-c", "16", "--chunks", "1"], { home, hub });
  assert.equal(r.code, 0, r.stderr);
  assert.ok(hub.served["kvq-test/sharded/model-00001-of-00002.safetensors"] > 0);
  assert.ok(hub.served["kvq-test/sharded/model-00002-of-00002.safetensors"] > 0);
});

test("a cut download resumes: the bytes already there are not fetched again", async () => {
  hub.reset();
  const home = tmpHome("resume");
  const cutAt = 10 << 20;
  hub.faults.cut = { file: "model.safetensors", after: cutAt, times: 10 };
  const r1 = await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub });
  assertOneLine(r1, /kvq-chat: kvq-test\/demo: the download of model\.safetensors was cut at 10\.0 MiB of 32\.2 MiB \(kept in .*\.incomplete; run again to resume\)$/);
  const part = blobs(home).filter((b) => b.endsWith(".incomplete"));
  assert.equal(part.length, 1);
  assert.equal(fs.statSync(path.join(repoDir(home, "kvq-test/demo"), "blobs", part[0])).size, cutAt);
  const commit = hub.repos.get("kvq-test/demo").commit;
  assert.ok(!fs.existsSync(path.join(repoDir(home, "kvq-test/demo"), "snapshots", commit, "model.safetensors")), "not linked");

  hub.reset();
  const r2 = await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub });
  assert.equal(r2.code, 0, r2.stderr);
  assert.match(r2.stderr, /resuming at 10\.0 MiB/);
  assert.equal(hub.served[WEIGHTS], SIZE - cutAt, "only the rest");
  assert.equal(r2.stdout, demoRef.stdout);
});

test("a connection cut once is resumed within the same run", async () => {
  hub.reset();
  const home = tmpHome("retry");
  hub.faults.cut = { file: "model.safetensors", after: 5 << 20, times: 1 };
  const r = await run("kvq-tokenize", ["-m", "kvq-test/demo", "-p", "x"], { home, hub }); // no weights: nothing cut
  assert.equal(r.code, 0, r.stderr);
  assert.equal(hub.served[WEIGHTS], undefined, "kvq-tokenize fetches no weights");
  const c = await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub });
  assert.equal(c.code, 0, c.stderr);
  assert.match(c.stderr, /connection cut at 5\.0 MiB; retrying/);
  assert.equal(hub.served[WEIGHTS], SIZE);
});

test("a checksum mismatch removes the file and says so; the next run fetches it whole", async () => {
  hub.reset();
  const home = tmpHome("sha");
  hub.faults.badSha = "model.safetensors";
  const r = await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub });
  assertOneLine(r, /kvq-test\/demo: checksum mismatch for model\.safetensors \(sha256 [0-9a-f]{64}, expected [0-9a-f]{64}\): the file was removed, run again to retry$/);
  assert.deepEqual(blobs(home).filter((b) => b.length === 64 || b.endsWith(".incomplete")), [], "nothing half-written kept");
  hub.reset();
  const ok = await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub });
  assert.equal(ok.code, 0, ok.stderr);
});

test("HF_HUB_OFFLINE=1 never touches the network: an error without the files, a load with them", async () => {
  hub.reset();
  const home = tmpHome("offline");
  const env = { HF_HUB_OFFLINE: "1" };
  const miss = await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub, env });
  assertOneLine(miss, /kvq-test\/demo: HF_HUB_OFFLINE=1 and revision 'main' is not in the cache \(.*models--kvq-test--demo\); unset HF_HUB_OFFLINE to download it$/);
  // config and tokenizer only: still not enough for a load
  assert.equal((await run("kvq-tokenize", ["-m", "kvq-test/demo", "-p", "x"], { home, hub })).code, 0);
  hub.reset();
  const part = await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub, env });
  assertOneLine(part, /HF_HUB_OFFLINE=1 and the cached snapshot .* lacks model\.safetensors/);
  assert.equal((await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub })).code, 0);
  hub.reset();
  const ok = await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub, env });
  assert.equal(ok.code, 0, ok.stderr);
  assert.equal(ok.stdout, demoRef.stdout);
  assert.deepEqual(hub.requests, [], "no request reached the hub");
});

test("two processes downloading the same model: one writes, the other waits; one blob", async () => {
  hub.reset();
  const home = tmpHome("twice");
  hub.faults.slow = 24 << 20; // ~1.4 s for the weights: the second process finds the lock held
  const [a, b] = await Promise.all([run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub }), run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub })]);
  assert.equal(a.code, 0, a.stderr);
  assert.equal(b.code, 0, b.stderr);
  assert.equal(hub.served[WEIGHTS], SIZE, "the weights were served once");
  assert.match(a.stderr + b.stderr, /another process is downloading it; waiting/);
  const all = blobs(home);
  assert.equal(all.filter((x) => x.length === 64).length, 1);
  assert.ok(!all.some((x) => x.endsWith(".incomplete")));
});

test("--plan reads config.json and 8 bytes of each weight file, and prints the fit and speed", async () => {
  hub.reset();
  const home = tmpHome("plan");
  const r = await run("kvq-chat", ["--plan", "-m", "kvq-test/demo", "-c", "0", "-ctk", "q4_0", "-ctv", "q8_0"], { home, hub });
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /^model: kvq-test\/demo \(LlamaForCausalLM, 4 layers, AQLM 2x8, groups of 8\), trained context 1024$/m);
  assert.match(r.stdout, /^download: 32\.2 MiB in 1 weight file \(0 B already here\); disk free .* fits$/m);
  assert.match(r.stdout, /^memory at -c 1024, -ctk q4, -ctv q8: [0-9.]+ GiB \(weights [0-9.]+ GiB, KV cache [0-9.]+ GiB, buffers [0-9.]+ GiB\)$/m);
  assert.match(r.stdout, /^RAM: [0-9.]+ GiB, [0-9.]+ GiB available: fits on the CPU$/m);
  assert.match(r.stdout, /^placement: GPU layers and device memory are planned once the weights are in the cache$/m);
  assert.match(r.stdout, /^speed: memory bandwidth [0-9.]+ GB\/s; decode at most ~[0-9.]+ tok\/s/m);
  assert.equal(hub.served[WEIGHTS], 8, "only the header length");
  assert.deepEqual(blobs(home).filter((b) => b.length === 64), [], "no weights in the cache");
  // once downloaded, the plan reads the cache alone and places the weights as the loader would
  assert.equal((await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub })).code, 0);
  hub.reset();
  const p2 = await run("kvq-ppl", ["--plan", "-m", "kvq-test/demo", "-c", "256"], { home, hub, env: { HF_HUB_OFFLINE: "1" } });
  assert.equal(p2.code, 0, p2.stderr);
  assert.match(p2.stdout, /^download: 0 B in 1 weight file \(32\.2 MiB already here\)/m);
  assert.match(p2.stdout, /^placement: gpu_layers=\d+\/4 gpu_mib=[0-9.]+ cpu_mib=[0-9.]+ /m);
  assert.deepEqual(hub.requests, []);
});

test("tools/model-catalog.sh makes its table from --plan", async () => {
  const home = tmpHome("catalog");
  const out = await new Promise((resolve) => {
    const p = spawn("sh", [path.join(ROOT, "tools/model-catalog.sh"), "-b", BUILD, "kvq-test/demo", "kvq-test/missing"],
      { env: { ...process.env, HF_HOME: home, HF_ENDPOINT: hub.url } });
    let s = "";
    p.stdout.on("data", (d) => (s += d));
    p.on("close", (code) => resolve({ code, s }));
  });
  assert.equal(out.code, 0);
  const rows = out.s.trim().split("\n");
  assert.equal(rows.length, 4);
  assert.match(rows[2], /^\| kvq-test\/demo \| LlamaForCausalLM \| AQLM 2x8 \| 32\.2 MiB (\| [0-9.]+ GiB ){4}\|$/);
  assert.match(rows[3], /^\| kvq-test\/missing \| kvq-chat: kvq-test\/missing: not found/);
});

test("errors, one line each", async (t) => {
  const home = tmpHome("errors");
  const tok = (model, env = {}, h = hub) => run("kvq-tokenize", ["-m", model, "-p", "x"], { home, hub: h, env });
  await t.test("gated without a token", async () => {
    hub.reset();
    const r = await tok("kvq-test/gated");
    assertOneLine(r, new RegExp(`kvq-test/gated: access denied \\(HTTP 401\\) to config\\.json: the model is gated or private; accept the license at ${hub.url}/kvq-test/gated and set HF_TOKEN$`));
  });
  await t.test("gated with a wrong token, then the right one (HF_TOKEN and $HF_HOME/token)", async () => {
    const r = await tok("kvq-test/gated", { HF_TOKEN: "hf_wrong" });
    assertOneLine(r, /access denied \(HTTP 403\) .* set HF_TOKEN \(a token was sent: does it have access\?\)$/);
    assert.equal((await tok("kvq-test/gated", { HF_TOKEN: hub.token })).code, 0);
    const home2 = tmpHome("token");
    fs.writeFileSync(path.join(home2, "token"), hub.token + "\n");
    const r2 = await run("kvq-chat", chatArgs("kvq-test/gated"), { home: home2, hub });
    assert.equal(r2.code, 0, r2.stderr);
  });
  await t.test("no such model, no such revision", async () => {
    assertOneLine(await tok("kvq-test/missing"), /kvq-test\/missing: not found \(HTTP 401\): no model kvq-test\/missing with revision 'main' on http:\/\/127\.0\.0\.1:\d+ \(if it is private, set HF_TOKEN\) \(and no directory of that name\)$/);
    assertOneLine(await tok("kvq-test/demo:v9"), /kvq-test\/demo: not found \(HTTP 404\): no model kvq-test\/demo with revision 'v9' on /);
  });
  await t.test("a file the hub answers 404 for", async () => {
    hub.reset();
    hub.faults.status = { file: "tokenizer.json", code: 404 };
    assertOneLine(await run("kvq-tokenize", ["-m", "kvq-test/demo", "-p", "x"], { home: tmpHome("e404"), hub }),
      /kvq-test\/demo: not found \(HTTP 404\): tokenizer\.json at revision 'main' on /);
  });
  await t.test("unsupported architecture, said before any weight is fetched", async () => {
    hub.reset();
    const r = await run("kvq-chat", chatArgs("kvq-test/bert"), { home, hub });
    assertOneLine(r, /kvq-test\/bert: unsupported architecture 'BertModel' \(LlamaForCausalLM.*\) \(no weights were downloaded\)$/);
    assert.equal(hub.served["kvq-test/bert/model.safetensors"], undefined);
  });
  await t.test("disk full", async () => {
    hub.reset();
    const r = await run("kvq-chat", chatArgs("kvq-test/demo"), { home: tmpHome("disk"), hub, env: { KVQ_HUB_DISK_FREE: String(8 << 20) } });
    assertOneLine(r, /kvq-test\/demo: not enough disk space: the weights need 32\.2 MiB, 8\.0 MiB free in .*blobs$/);
    assert.equal(hub.served[WEIGHTS], undefined);
  });
  await t.test("network down", async () => {
    const r = await tok("kvq-test/demo", {}, { url: "http://127.0.0.1:1" });
    assertOneLine(r, /cannot reach http:\/\/127\.0\.0\.1:1\/api\/models\/kvq-test\/demo\/revision\/main \(.*\); check the network, or set HF_HUB_OFFLINE=1 to use only the cache$/);
    hub.reset();
    hub.faults.down = true;
    assertOneLine(await tok("kvq-test/demo"), /cannot reach .*set HF_HUB_OFFLINE=1 to use only the cache$/);
  });
  await t.test("cache types and -c 0", async () => {
    const r = await run("kvq-chat", ["-m", DEMO, "-ctk", "q5"], {});
    assertOneLine(r, /^kvq-chat: bad value 'q5' for -ctk: the cache types are f32, f16, q8 \(q8_0\), q4 \(q4_0\)$/);
    const c0 = await run("kvq-chat", ["-m", DEMO, "-p", "The jury said", "-n", "1", "-c", "0", "-ctk", "q8_0", "-ctv", "q4_0"], {});
    assert.equal(c0.code, 0, c0.stderr);
    assert.match(c0.stderr, /allocated \(K q8, V q4\)/);
  });
});
