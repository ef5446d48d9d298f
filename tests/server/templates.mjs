// The demo model under a published chat template (tests/data/chat_templates/NAME), for the
// tool-calling tests: a temporary directory of links to the demo's files with the
// template's chat_template in its tokenizer_config.json. removeDemoDirs() cleans up.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { MODEL } from "./lib.mjs";

export const TEMPLATES = path.join(path.dirname(new URL(import.meta.url).pathname), "..", "data", "chat_templates");
const dirs = [];

export function demoWith(template) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kvq-template-"));
  dirs.push(dir);
  for (const f of fs.readdirSync(MODEL))
    if (f !== "tokenizer_config.json") fs.symlinkSync(path.resolve(MODEL, f), path.join(dir, f));
  const own = JSON.parse(fs.readFileSync(path.join(MODEL, "tokenizer_config.json"), "utf8"));
  const t = JSON.parse(fs.readFileSync(path.join(TEMPLATES, template, "tokenizer_config.json"), "utf8"));
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify({ ...own, chat_template: t.chat_template }));
  return dir;
}

export function removeDemoDirs() {
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
}
