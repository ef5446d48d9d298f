// A local Hugging Face hub for the tests (loopback only): the API routes huggingface_hub and
// @huggingface/hub call, the resolve route with its 302 to a "CDN" route for LFS files, Range
// requests, and fault switches. Counts the body bytes it serves per file.
//
//   const hub = await startHub({ repos: { "kvq-test/demo": { dir: "models/demo" } } });
//   hub.url; hub.served["kvq-test/demo/model.safetensors"]; hub.faults.cut = {...}; await hub.close();
//
// Faults (hub.faults, changed between runs):
//   cut:    { file, after, times }  GETs of file stop after `after` body bytes (connection dropped), `times` times
//   status: { file, code }          the resolve route answers code (401, 403, 404, 500) for file ("*": all)
//   badSha: file                    X-Linked-Etag / the API's lfs.oid of file is a wrong sha256
//   slow:   bytes per second        bodies are sent at about that rate
//   down:   true                    every request's connection is dropped at once
import http from "node:http";
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";

const LFS_MIN = 10 << 20;

function gitBlobSha1(buf) {
  return crypto.createHash("sha1").update(`blob ${buf.length}\0`).update(buf).digest("hex");
}

function loadRepo(id, spec) {
  const names = spec.files ?? fs.readdirSync(spec.dir).filter((f) => fs.statSync(path.join(spec.dir, f)).isFile()).sort();
  const files = new Map();
  for (const name of names) {
    const data = spec.content?.[name] ?? fs.readFileSync(path.join(spec.dir, name));
    const lfs = name.endsWith(".safetensors") || data.length >= LFS_MIN;
    files.set(name, { name, data, lfs, oid: gitBlobSha1(data), sha256: lfs ? crypto.createHash("sha256").update(data).digest("hex") : null });
  }
  const commit = crypto.createHash("sha1").update(id + [...files.values()].map((f) => f.name + f.oid).join()).digest("hex");
  return { id, files, commit, gated: !!spec.gated, refs: { main: commit, ...(spec.refs ?? {}) } };
}

export async function startHub({ repos, token = "hf_test_token" } = {}) {
  const repoMap = new Map(Object.entries(repos).map(([id, spec]) => [id, loadRepo(id, spec)]));
  const byBlob = new Map(); // "org/name/sha256" -> [repo, file]
  for (const r of repoMap.values()) for (const f of r.files.values()) if (f.lfs) byBlob.set(`${r.id}/${f.sha256}`, [r, f]);
  const hub = { faults: {}, served: {}, requests: [], token, repos: repoMap };

  const wrongSha = (f) => (hub.faults.badSha === f.name ? crypto.createHash("sha256").update("not " + f.name).digest("hex") : f.sha256);
  const revision = (r, rev) => (r.refs[rev] ?? (rev === r.commit ? r.commit : null));
  const entry = (r, f) => ({
    type: "file", path: f.name, oid: f.oid, size: f.data.length,
    ...(f.lfs ? { lfs: { oid: wrongSha(f), size: f.data.length, pointerSize: 134 } } : {}),
    lastCommit: { id: r.commit, title: "upload", date: "2026-01-01T00:00:00.000Z" },
  });

  function json(res, code, obj, extra = {}) {
    const body = Buffer.from(JSON.stringify(obj));
    res.writeHead(code, { "Content-Type": "application/json", "Content-Length": body.length, ...extra });
    res.end(body);
  }
  const notFound = (res, code, msg) => json(res, 404, { error: msg }, { "X-Error-Code": code, "X-Error-Message": msg });

  function authOk(req, r) {
    if (!r.gated) return 0;
    const a = req.headers.authorization;
    if (!a) return 401;
    return a === `Bearer ${token}` ? 0 : 403;
  }

  // Body of f (from `start`), with Range, cuts, slowness; counts what it writes.
  function sendBody(req, res, r, f, headers) {
    const size = f.data.length;
    let start = 0, end = size - 1, code = 200;
    const m = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range ?? "");
    if (m) {
      start = Number(m[1]);
      if (m[2] !== "") end = Math.min(Number(m[2]), size - 1);
      if (start >= size || start > end) {
        res.writeHead(416, { ...headers, "Content-Range": `bytes */${size}` });
        return res.end();
      }
      code = 206;
      headers["Content-Range"] = `bytes ${start}-${end}/${size}`;
    }
    headers["Content-Length"] = end - start + 1;
    headers["Accept-Ranges"] = "bytes";
    res.writeHead(code, headers);
    if (req.method === "HEAD") return res.end();
    const key = `${r.id}/${f.name}`;
    const cut = hub.faults.cut && hub.faults.cut.file === f.name && (hub.faults.cut.times ?? 1) > 0 ? hub.faults.cut : null;
    if (cut) cut.times = (cut.times ?? 1) - 1;
    let pos = start;
    const stop = cut ? Math.min(end + 1, Math.max(start, cut.after)) : end + 1;
    const rate = hub.faults.slow;
    const chunk = rate ? Math.max(1024, Math.floor(rate / 20)) : 1 << 20;
    const pump = () => {
      while (pos < stop) {
        const n = Math.min(chunk, stop - pos);
        const ok = res.write(f.data.subarray(pos, pos + n));
        pos += n;
        hub.served[key] = (hub.served[key] ?? 0) + n;
        if (rate) return setTimeout(pump, (1000 * n) / rate);
        if (!ok) return res.once("drain", pump);
      }
      if (stop <= end) res.socket?.destroy(); // the cut: the client sees a short body
      else res.end();
    };
    pump();
  }

  function resolveRoute(req, res, r, rev, file) {
    const commit = revision(r, rev);
    if (!commit) return notFound(res, "RevisionNotFound", `Invalid rev id: ${rev}`);
    const st = hub.faults.status;
    if (st && (st.file === file || st.file === "*")) return json(res, st.code, { error: `fault ${st.code}` });
    const denied = authOk(req, r);
    if (denied) return json(res, denied, { error: "Access to this model is restricted. You must accept the conditions." }, { "X-Error-Code": "GatedRepo" });
    const f = r.files.get(file);
    if (!f) return notFound(res, "EntryNotFound", `${file} does not exist on "${rev}"`);
    const headers = { "X-Repo-Commit": commit, ETag: `"${f.lfs ? f.sha256 : f.oid}"` };
    if (f.lfs) {
      const sha = wrongSha(f);
      res.writeHead(302, {
        ...headers, Location: `/cdn/${r.id}/${f.sha256}`, "X-Linked-Etag": `"${sha}"`, "X-Linked-Size": String(f.data.length), "Content-Length": 0,
      });
      return res.end();
    }
    sendBody(req, res, r, f, headers);
  }

  function apiRoute(req, res, r, kind, rev, body) {
    const commit = revision(r, rev);
    if (!commit) return notFound(res, "RevisionNotFound", `Invalid rev id: ${rev}`);
    if (kind === "revision")
      return json(res, 200, {
        _id: r.id, id: r.id, modelId: r.id, sha: commit, private: false, gated: r.gated ? "manual" : false, downloads: 0, likes: 0,
        lastModified: "2026-01-01T00:00:00.000Z", pipeline_tag: "text-generation", tags: [],
        siblings: [...r.files.keys()].map((rfilename) => ({ rfilename })),
      });
    if (kind === "tree") return json(res, 200, [...r.files.values()].map((f) => entry(r, f)));
    if (kind === "paths-info") {
      let want = [];
      try { want = JSON.parse(body).paths ?? []; } catch { /* an empty answer */ }
      return json(res, 200, want.filter((p) => r.files.has(p)).map((p) => entry(r, r.files.get(p))));
    }
    notFound(res, "EntryNotFound", "no such route");
  }

  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const url = new URL(req.url, "http://hub");
      const p = decodeURIComponent(url.pathname);
      hub.requests.push(`${req.method} ${p}`);
      if (hub.faults.down) return req.socket.destroy();
      let m;
      if ((m = /^\/api\/models\/([^/]+\/[^/]+)\/(revision|tree|paths-info)\/([^/]+)(?:\/.*)?$/.exec(p))) {
        const r = repoMap.get(m[1]);
        if (!r) return json(res, 401, { error: "Repository not found" }, { "X-Error-Code": "RepoNotFound" });
        return apiRoute(req, res, r, m[2], m[3], Buffer.concat(chunks).toString());
      }
      if ((m = /^\/([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(p))) {
        const r = repoMap.get(m[1]);
        if (!r) return notFound(res, "RepoNotFound", "Repository not found");
        return resolveRoute(req, res, r, m[2], m[3]);
      }
      if ((m = /^\/cdn\/([^/]+\/[^/]+\/[0-9a-f]{64})$/.exec(p)) && byBlob.has(m[1])) {
        const [r, f] = byBlob.get(m[1]);
        return sendBody(req, res, r, f, { ETag: `"${f.sha256}"`, "Content-Type": "application/octet-stream" });
      }
      notFound(res, "EntryNotFound", "not found");
    });
  });
  await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
  hub.url = `http://127.0.0.1:${server.address().port}`;
  hub.close = () => new Promise((ok) => { server.closeAllConnections?.(); server.close(() => ok()); });
  hub.reset = () => { hub.faults = {}; hub.served = {}; hub.requests = []; };
  return hub;
}

// Standalone: node hub_server.mjs ORG/NAME=DIR ... (prints the URL, serves until killed).
if (import.meta.url === `file://${process.argv[1]}`) {
  const repos = Object.fromEntries(process.argv.slice(2).map((a) => a.split("=")).map(([id, dir]) => [id, { dir }]));
  const hub = await startHub({ repos });
  console.log(hub.url);
}
