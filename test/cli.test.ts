import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { parse } from "yaml";
import { runCli } from "./helpers/cli.js";

const COMMANDS = [
  "download",
  "preprocess",
  "build-index",
  "serve-retriever",
  "train",
  "eval",
  "convert-ckpt",
];
const dir = mkdtempSync(join(tmpdir(), "searchr1-cli-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("searchr1 CLI", () => {
  it("--help lists all seven commands and the convert alias", () => {
    const r = runCli(["--help"]);
    expect(r.code).toBe(0);
    for (const c of COMMANDS) expect(r.stdout).toMatch(new RegExp(`^  ${c}[ |]`, "m"));
    expect(r.stdout).toContain("convert-ckpt|convert");
  });

  it("--version prints the package version", () => {
    const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8"));
    const r = runCli(["--version"]);
    expect(r.code).toBe(0);
    expect(r.stdout.trim()).toBe(pkg.version);
  });

  it.each(COMMANDS)("%s --help shows options with schema defaults and a real example", (c) => {
    const r = runCli([c, "--help"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain(`Usage: searchr1 ${c}`);
    expect(r.stdout).toContain("--config <file>");
    expect(r.stdout).toMatch(new RegExp(`Examples:\\n  \\$ searchr1 (${c}|convert) -{0,2}\\w`));
  });

  it("help texts carry defaults from the schema", () => {
    expect(runCli(["train", "--help"]).stdout).toMatch(
      /--gpus <n>\s+GPUs per node[\s\S]*?\(default: 1\)/,
    );
    expect(runCli(["preprocess", "--help"]).stdout).toMatch(
      /--format <search-r1\|verl>[\s\S]*?\(default:\s+search-r1\)/,
    );
    expect(runCli(["download", "--help"]).stdout).toMatch(/HF_TOKEN\s+sets token/);
  });

  it.each(["train", "eval", "ask"])(
    "%s without a model says which key to set, and prints nothing on stdout",
    (c) => {
      const r = runCli([c, ...(c === "ask" ? ["a question"] : [])]);
      expect(r.code).toBe(2);
      expect(r.stderr).toMatch(/missing required key "model\.path".*--model/);
      expect(r.stdout).toBe("");
    },
  );

  it("the convert alias reaches convert-ckpt, whose <kind> is checked like any config key", () => {
    const r = runCli(["convert", "deepspeed-to-hf", "--input", "x", "--out", "y"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(
      '"kind" = "deepspeed-to-hf" (argument <kind>): expected one of megatron-to-hf|fsdp-to-hf|native-to-hf',
    );
    const none = runCli(["convert", "--input", "x", "--out", "y"]);
    expect(none.code).toBe(2);
    expect(none.stderr).toContain(
      'missing required key "kind": expected one of megatron-to-hf|fsdp-to-hf|native-to-hf|peft-to-hf (set it with <kind> argument',
    );
  });

  it("an unknown command or option is a usage error (exit 2)", () => {
    const a = runCli(["frobnicate"]);
    expect(a.code).toBe(2);
    expect(a.stderr).toContain("unknown command 'frobnicate'");
    const b = runCli(["preprocess", "--no-such-flag"]);
    expect(b.code).toBe(2);
    expect(b.stderr).toContain("unknown option '--no-such-flag'");
  });
});

describe("searchr1 config", () => {
  it("prints the resolved config as YAML from file, env and overrides", () => {
    const base = join(dir, "base.yaml");
    writeFileSync(base, "model:\n  path: /models/base\nactor:\n  lr: 2.0e-6\n");
    const run = join(dir, "run.yaml");
    writeFileSync(run, "extends: base.yaml\nrollout:\n  n: 8\n");
    const r = runCli(
      [
        "config",
        "train",
        "--config",
        run,
        "actor.lr=5e-7",
        "data.train_files=[a.parquet,b.parquet]",
      ],
      {
        env: { SEARCHR1_RETRIEVER_URL: "http://127.0.0.1:9000/retrieve" },
      },
    );
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    const cfg = parse(r.stdout);
    expect(cfg.model.path).toBe("/models/base");
    expect(cfg.actor.lr).toBe(5e-7);
    expect(cfg.rollout.n).toBe(8);
    expect(cfg.data.train_files).toEqual(["a.parquet", "b.parquet"]);
    expect(cfg.retriever.url).toBe("http://127.0.0.1:9000/retrieve");
    expect(cfg.actor.kl_loss_coef).toBe(0.001);
  });

  it("reports a typo with file:line:col and a suggestion, exit 2", () => {
    const bad = join(dir, "typo.yaml");
    writeFileSync(bad, "model:\n  path: m\nactor:\n  lrr: 1e-6\n");
    const r = runCli(["config", "train", "-c", bad]);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe("");
    expect(r.stderr).toMatch(
      /searchr1: error: unknown key "actor\.lrr" \(.*typo\.yaml:4:3\); did you mean "actor\.lr"\?/,
    );
  });

  it("--schema prints a JSON Schema with defaults for editor completion", () => {
    const r = runCli(["config", "train", "--schema"]);
    expect(r.code).toBe(0);
    const schema = JSON.parse(r.stdout);
    expect(schema.properties.actor.properties.lr.default).toBe(1e-6);
    expect(schema.properties.algorithm.properties.name.enum).toEqual([
      "grpo",
      "ppo",
      "reinforce_plus_plus",
      "rloo",
    ]);
    expect(schema.required).toContain("model");
  });

  it("rejects an unknown command name", () => {
    const r = runCli(["config", "nope"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('config: unknown command "nope"');
    expect(r.stderr).toContain("convert-ckpt (alias convert)");
  });

  it("prints the defaults without a model, marking required keys that are not set", () => {
    const r = runCli(["config", "train"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^model:\n {2}path: null # required: set --model or model\.path$/m);
    const cfg = parse(r.stdout);
    expect(cfg.model.path).toBeNull();
    expect(cfg.actor.lr).toBe(1e-6);
    expect(cfg.rollout.n).toBe(5);
    expect(r.stderr).toBe(
      "searchr1: note: required and not set (null above): model.path; `searchr1 train` refuses to run without it\n",
    );
    const convert = runCli(["config", "convert-ckpt", "out=hf"]);
    expect(convert.code).toBe(0);
    expect(convert.stdout).toMatch(/^kind: null # required: set the <kind> argument or kind$/m);
    expect(convert.stdout).toMatch(/^input: null # required: set --input or input$/m);
    expect(convert.stdout).toMatch(/^out: hf$/m);
    // The commands that run still refuse.
    const run = runCli(["convert", "fsdp-to-hf", "--out", "hf"]);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('missing required key "input"');
  });

  it("takes a command's alias wherever it takes its name", () => {
    const args = ["kind=fsdp-to-hf", "input=ckpt", "out=hf"];
    const byName = runCli(["config", "convert-ckpt", ...args]);
    const byAlias = runCli(["config", "convert", ...args]);
    expect(byAlias.stderr).toBe("");
    expect(byAlias.code).toBe(0);
    expect(byAlias.stdout).toBe(byName.stdout);
    expect(parse(byAlias.stdout).kind).toBe("fsdp-to-hf");
    const schema = runCli(["config", "convert", "--schema"]);
    expect(schema.code).toBe(0);
    expect(JSON.parse(schema.stdout).title).toBe("searchr1 convert-ckpt config");
    expect(runCli(["config", "convert", "--reference"]).stdout).toContain("| `kind` |");
    expect(runCli(["help", "convert"]).stdout).toContain("Usage: searchr1 convert-ckpt|convert");
  });
});
