// Shared by the kvq-server tests: start a server on an ephemeral loopback port.
// Environment (set by run.sh from ctest): KVQ_SERVER (binary), KVQ_MODEL (model dir),
// KVQ_BUILD_DIR (where artifacts such as the screenshot go).
import { spawn } from "node:child_process";
import { once } from "node:events";

export const BIN = process.env.KVQ_SERVER;
export const MODEL = process.env.KVQ_MODEL;
export const BUILD_DIR = process.env.KVQ_BUILD_DIR || ".";

// Starts kvq-server with the demo model (or KVQ_MODEL) plus args; resolves to
// { url, port, proc, stderr(), stop() } once it prints its address.
export async function startServer(args = [], { model = MODEL, env = {} } = {}) {
  // one thread: the CPU backend's multi-threaded decode hands out work as threads finish,
  // so its float sums (and a temperature > 0 draw near a tie) can differ from run to run
  const threads = args.includes("-t") ? [] : ["-t", "1"];
  // KVQ_SERVER_ARGS: flags added to every server a test starts (e.g. "--lookup 2" runs a
  // test's requests through speculative decoding, whose output must not differ)
  const extra = (process.env.KVQ_SERVER_ARGS || "").split(/\s+/).filter(Boolean);
  const argv = ["--port", "0", "--backend", "cpu", ...threads, ...(model ? ["-m", model] : []), ...extra, ...args];
  const proc = spawn(BIN, argv, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
  let err = "", out = "";
  proc.stderr.on("data", (d) => { err += d; });
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("kvq-server did not start in 60 s: " + err)), 60000);
    proc.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/\S+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on("exit", (code) => { clearTimeout(timer); reject(new Error(`kvq-server exited (${code}) before listening: ${err}`)); });
  });
  const exited = once(proc, "exit");
  // a test that dies leaves no server behind
  const reap = () => { if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL"); };
  process.on("exit", reap);
  exited.then(() => process.off("exit", reap));
  return {
    url, proc, port: Number(new URL(url).port), stderr: () => err,
    // SIGTERM, then the exit status (a graceful exit is 0)
    async stop(signal = "SIGTERM") {
      if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode;
      proc.kill(signal);
      const [code, sig] = await exited;
      return sig ? `signal ${sig}` : code;
    },
  };
}

export async function postJSON(url, body, headers = {}) {
  const res = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json", ...headers },
                                 body: typeof body === "string" ? body : JSON.stringify(body) });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch (e) {}
  return { status: res.status, headers: res.headers, text, json };
}

export async function metric(base, name) {
  const t = await (await fetch(base + "/metrics")).text();
  const m = t.match(new RegExp("^kvq_" + name + " (\\S+)$", "m"));
  return m ? Number(m[1]) : NaN;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
