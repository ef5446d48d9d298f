// The hub's own JS client as the peer: a cache filled by @huggingface/hub loads in kvq offline,
// and the cache kvq wrote reads as valid to its scanCacheDir.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { hubWithRepos, tmpHome, repoDir, run, chatArgs, DEMO, ROOT } from "./lib.mjs";

// @huggingface/hub lives in tests/server/node_modules (one npm ci for all the Node tests)
const hf = createRequire(path.join(ROOT, "tests/server/package.json"))("@huggingface/hub");
console.debug = () => {}; // the client's "Downloading ..." lines
const repo = { type: "model", name: "kvq-test/demo" };
const FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"];
let hub, ref;

before(async () => {
  hub = await hubWithRepos();
  ref = await run("kvq-chat", chatArgs(DEMO), {});
  assert.equal(ref.code, 0, ref.stderr);
});
after(() => hub.close());

test("snapshotDownload fills a cache that kvq loads with HF_HUB_OFFLINE=1", async () => {
  const home = tmpHome("peer-snap");
  const cacheDir = path.join(home, "hub");
  const snap = await hf.snapshotDownload({ repo, cacheDir, hubUrl: hub.url });
  assert.equal(path.basename(snap), hub.repos.get("kvq-test/demo").commit);
  hub.reset();
  const r = await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub, env: { HF_HUB_OFFLINE: "1", HF_HUB_CACHE: cacheDir } });
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout, ref.stdout);
  assert.deepEqual(hub.requests, []);
});

test("downloadFileToCacheDir at a commit: kvq loads ORG/NAME:COMMIT offline", async () => {
  const home = tmpHome("peer-file");
  const cacheDir = path.join(home, "hub");
  const commit = hub.repos.get("kvq-test/demo").commit;
  for (const f of FILES) await hf.downloadFileToCacheDir({ repo, path: f, revision: commit, cacheDir, hubUrl: hub.url });
  const r = await run("kvq-chat", chatArgs(`kvq-test/demo:${commit}`), { home, hub, env: { HF_HUB_OFFLINE: "1" } });
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout, ref.stdout);
  // and a revision name it never wrote a ref for is not guessed
  const main = await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub, env: { HF_HUB_OFFLINE: "1" } });
  assert.notEqual(main.code, 0);
});

test("scanCacheDir reads the cache kvq wrote: same files, same revision, no broken links", async () => {
  const home = tmpHome("peer-scan");
  const r = await run("kvq-chat", chatArgs("kvq-test/demo"), { home, hub });
  assert.equal(r.code, 0, r.stderr);
  const scan = await hf.scanCacheDir(path.join(home, "hub"));
  assert.deepEqual(scan.warnings, []);
  assert.equal(scan.repos.length, 1);
  const c = scan.repos[0];
  assert.deepEqual(c.id, { name: "kvq-test/demo", type: "model" });
  assert.equal(c.filesCount, FILES.length);
  assert.equal(c.revisions.length, 1);
  const rev = c.revisions[0];
  assert.equal(rev.commitOid, hub.repos.get("kvq-test/demo").commit);
  assert.deepEqual(rev.refs, ["main"]);
  assert.deepEqual(rev.files.map((f) => path.basename(f.path)).sort(), FILES);
  for (const f of rev.files) {
    assert.equal(path.dirname(f.blob.path), path.join(fs.realpathSync(repoDir(home, "kvq-test/demo")), "blobs"));
    assert.equal(f.blob.size, fs.statSync(path.join(DEMO, path.basename(f.path))).size);
  }
  // the client's own download into that cache finds kvq's files and adds nothing
  hub.reset();
  await hf.downloadFileToCacheDir({ repo, path: "model.safetensors", revision: rev.commitOid, cacheDir: path.join(home, "hub"), hubUrl: hub.url });
  assert.equal(hub.served["kvq-test/demo/model.safetensors"], undefined);
});
