// Shared by the hub tests: the local hub with its repositories, a fresh HF_HOME per test, and
// the kvq tools run with HF_ENDPOINT pointed at the hub.
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { startHub } from "./hub_server.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(here, "../..");
export const BUILD = process.env.KVQ_BUILD_DIR ?? path.join(ROOT, "build");
export const DEMO = path.join(ROOT, "models/demo");
// the sharded fixture (an index and two safetensors files), when ../shared has it
export const SHARDED = path.resolve(ROOT, "../shared/fixtures/models/llama3-tiny-aqlm-1x16g16");
export const HAVE_SHARDED = fs.existsSync(path.join(SHARDED, "model.safetensors.index.json"));

const unsupportedConfig = JSON.stringify({ architectures: ["BertModel"], model_type: "bert", hidden_size: 64, num_hidden_layers: 2 });

export async function hubWithRepos() {
  const repos = {
    "kvq-test/demo": { dir: DEMO, files: ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] },
    "kvq-test/gated": { dir: DEMO, files: ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"], gated: true },
    "kvq-test/bert": {
      dir: DEMO, files: ["config.json", "model.safetensors", "tokenizer.json"],
      content: { "config.json": Buffer.from(unsupportedConfig) },
    },
  };
  if (HAVE_SHARDED)
    repos["kvq-test/sharded"] = {
      dir: SHARDED,
      files: ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
        "tokenizer.json", "tokenizer_config.json"],
    };
  return startHub({ repos });
}

// Fresh HF_HOMEs, removed when the test file's process exits (each holds a model's copy).
const homes = [];
process.on("exit", () => { for (const h of homes) fs.rmSync(h, { recursive: true, force: true }); });
export function tmpHome(tag) {
  const h = fs.mkdtempSync(path.join(os.tmpdir(), `kvq-hub-${tag}-`));
  homes.push(h);
  return h;
}

export function repoDir(home, id) {
  return path.join(home, "hub", "models--" + id.replace("/", "--"));
}

// Runs a tool; resolves with its exit code and output (never rejects on a non-zero exit).
export function run(tool, args, { home, hub, env = {} } = {}) {
  const e = { ...process.env, HF_HOME: home, HF_ENDPOINT: hub?.url ?? "http://127.0.0.1:1", ...env };
  for (const k of ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HF_HUB_OFFLINE", "HF_TOKEN_PATH"]) if (!(k in env)) delete e[k];
  return new Promise((resolve) => {
    const p = spawn(path.join(BUILD, tool), args, { env: e });
    let stdout = "", stderr = "";
    p.stdout.on("data", (d) => (stdout += d));
    p.stderr.on("data", (d) => (stderr += d));
    p.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}

// A one-token greedy continuation: enough to load every weight and run a step.
export const chatArgs = (model) => ["-m", model, "-p", "The jury said", "-n", "1", "--temp", "0", "-c", "64"];
