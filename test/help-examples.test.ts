// Every example in every help text runs. The commands come from the CLIs themselves
// (searchr1's command tree, the Commands: list of `searchr1-trainer --help`), so a new command
// is covered as soon as it is registered, and it must come with at least one example. Each
// example runs as a shell line in a fresh temporary folder that holds the small inputs it
// names (tiny models, corpora, datasets made here). The examples that cannot run here are
// handled by the RULES below, each with its reason; none is left out silently.
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import { afterAll, describe, expect, it } from "vitest";
import { buildProgram } from "../cli/program.js";
import { nativeExecutable } from "../src/runtime/native-executable.js";
import { jsonl, put } from "./data/helpers.js";
import { BIN } from "./helpers/cli.js";
import { generateCorpus } from "./retrieval/generated-corpus.js";

const TRAINER = nativeExecutable("searchr1-trainer");
const INDEX = nativeExecutable("searchr1-index");
const CKPT = fileURLToPath(new URL("./ckpt/fixtures/", import.meta.url));
const NATIVE = fileURLToPath(new URL("./native/fixtures/", import.meta.url));
const PACKAGE = fileURLToPath(new URL("../", import.meta.url));

const root = mkdtempSync(join(tmpdir(), "searchr1-help-examples-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** `searchr1` and `searchr1-trainer` on the PATH, as a user who installed them has them. */
const binDir = join(root, "bin");
mkdirSync(binDir);
symlinkSync(BIN, join(binDir, "searchr1"));
symlinkSync(TRAINER, join(binDir, "searchr1-trainer"));
symlinkSync(INDEX, join(binDir, "searchr1-index"));
// (and the dense retriever's corpus cache and the web search cache inside the test's
// folder; the web search engines' keys, which their servers need to start: a server
// example only starts, answers GET /health and stops, so no search reaches an engine)
const ENV = {
  ...process.env,
  PATH: `${binDir}:${process.env.PATH}`,
  OMP_NUM_THREADS: "2",
  XDG_CACHE_HOME: join(root, "cache"),
  SERPAPI_API_KEY: "help-example-key",
  SERPER_API_KEY: "help-example-key",
  GOOGLE_API_KEY: "help-example-key",
  GOOGLE_CSE_ID: "help-example-cse",
};

function help(argv: string[]): string {
  const r = spawnSync(argv[0] as string, argv.slice(1), { encoding: "utf8", env: ENV });
  if (r.status !== 0) throw new Error(`${argv.join(" ")} exited ${r.status}: ${r.stderr}`);
  return r.stdout;
}

/** The `  $ command line` entries under "Examples:" in a help text. */
function examplesOf(text: string): string[] {
  const lines = text.split("\n");
  const start = lines.findIndex((l) => l.trim() === "Examples:");
  if (start < 0) return [];
  const out: string[] = [];
  for (const line of lines.slice(start + 1)) {
    const m = /^\s+\$ (.+)$/.exec(line);
    if (!m) break;
    out.push((m[1] as string).trim());
  }
  return out;
}

/** The command names listed under "Commands:" in `searchr1-trainer --help`. */
function trainerCommands(text: string): string[] {
  const lines = text.split("\n");
  const start = lines.findIndex((l) => l.trim() === "Commands:");
  const names: string[] = [];
  for (const line of lines.slice(start + 1)) {
    const m = /^\s+([a-z][\w-]*)\s/.exec(line);
    if (!m) break;
    names.push(m[1] as string);
  }
  return names;
}

interface HelpText {
  /** The command whose --help it is. */
  command: string;
  examples: string[];
}

const HELP_TEXTS: HelpText[] = [
  { command: "searchr1", examples: examplesOf(help([process.execPath, BIN, "--help"])) },
  ...buildProgram()
    .commands.map((c) => c.name())
    .map((name) => ({
      command: `searchr1 ${name}`,
      examples: examplesOf(help([process.execPath, BIN, name, "--help"])),
    })),
  { command: "searchr1-trainer", examples: examplesOf(help([TRAINER, "--help"])) },
  ...trainerCommands(help([TRAINER, "--help"])).map((name) => ({
    command: `searchr1-trainer ${name}`,
    examples: examplesOf(help([TRAINER, name, "--help"])),
  })),
  { command: "searchr1-index", examples: examplesOf(help([INDEX, "--help"])) },
  ...trainerCommands(help([INDEX, "--help"])).map((name) => ({
    command: `searchr1-index ${name}`,
    examples: examplesOf(help([INDEX, name, "--help"])),
  })),
];

const cuda = JSON.parse(help([TRAINER, "info"])).cuda as { available: boolean; reason: string };

/** What to do with an example that cannot simply run here and must exit 0. */
type Rule =
  | { match: RegExp; skip: string }
  | { match: RegExp; server: string }
  | { match: RegExp; agent: string; overrides: string[] };

/** Budgets that fit the tiny test model (context 512) and two shared cores. */
const AGENT_BUDGET = [
  "rollout.engine_device=cpu",
  "rollout.engine_threads=1",
  "data.max_prompt_length=400",
  "data.max_response_length=8",
  "data.max_obs_length=32",
  "rollout.max_turns=1",
];

const RULES: Rule[] = [
  {
    match: /^searchr1 download /,
    skip: "downloads from the Hugging Face hub: needs the network",
  },
  {
    match: /--device cuda\b/,
    skip: cuda.available ? "" : `needs a GPU (CUDA is not usable here: ${cuda.reason})`,
  },
  {
    match: /^searchr1 quickstart/,
    skip:
      "the whole quickstart takes about ten minutes of both cores; " +
      "test/quickstart/quickstart.test.ts runs it shortened",
  },
  {
    match: /^searchr1 train .*--nnodes 2\b/,
    skip: "one node of two, which waits for the other: test/train/nodes.test.ts runs both on the loopback",
  },
  {
    match: /^searchr1 train /,
    agent:
      "as for eval, with one step of two prompts on the tiny model and one GPU (the recipes " +
      "ask for 8, which this build refuses)",
    overrides: [
      ...AGENT_BUDGET,
      "trainer.gpus=1",
      "trainer.device=cpu",
      "trainer.threads=1",
      "trainer.total_training_steps=1",
      "data.train_batch_size=2",
      "rollout.n=2",
      "actor.ppo_mini_batch_size=2",
      "data.val_max_samples=1",
    ],
  },
  {
    match: /^searchr1 eval --compare /,
    agent: "compares two finished runs (written here): nothing to serve, nothing appended",
    overrides: [],
  },
  {
    match: /^searchr1 eval /,
    agent:
      "needs a retriever (and an engine where it names one): the test serves BM25 over a " +
      "small corpus and the tiny test model, points the example at them, and appends " +
      "budgets that fit that model",
    overrides: [...AGENT_BUDGET, "data.limit=2"],
  },
  {
    match: /^searchr1 ask /,
    agent: "as for eval",
    overrides: AGENT_BUDGET,
  },
  {
    match: /^searchr1 serve-(retriever|engine) /,
    server:
      "a server runs until stopped: run with port=0 appended (any free port), wait until " +
      "GET /health answers 200, then SIGTERM; it must exit 0",
  },
];

/**
 * Absolute paths in examples (/data/..., /models/...) are taken inside the example's
 * folder: the test writes nowhere else.
 */
const ABSOLUTE = /(^|[\s=])\/(data|models)\//g;

/** Inputs that examples name, made in the example's folder when its line matches. */
interface Input {
  /** Matched against the example line (absolute paths already rooted in the folder). */
  when: RegExp;
  /** Gets the example's folder and its line. */
  make(dir: string, line: string): void | Promise<void>;
}

const CORPUS = `${generateCorpus(300, 5).join("\n")}\n`;
const RETRIEVAL = fileURLToPath(new URL("./retrieval/fixtures/", import.meta.url));
const FAISS = join(RETRIEVAL, "faiss");
const AGENT_MODEL = fileURLToPath(new URL("./engine/fixtures/qwen-bpe/", import.meta.url));
const copy = (from: string, to: string) => (dir: string) =>
  cpSync(from, join(dir, to), { recursive: true });

function flashrag(dir: string): void {
  const datasets = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique"];
  const rows = (split: string, n: number) =>
    jsonl(
      Array.from({ length: n }, (_, i) => ({
        id: `${split}_${i}`,
        question: `question ${i} of the ${split} split`,
        golden_answers: [`answer ${i}`],
      })),
    );
  for (const d of datasets) {
    put(join(dir, "data", "FlashRAG_datasets", d, "train.jsonl"), rows("train", 5));
    put(
      join(dir, "data", "FlashRAG_datasets", d, d === "hotpotqa" ? "dev.jsonl" : "test.jsonl"),
      rows("test", 3),
    );
  }
  put(join(dir, "data", "FlashRAG_datasets", "bamboogle", "test.jsonl"), rows("test", 3));
}

function buildIndex(corpus: string, out: string) {
  return (dir: string) => {
    put(join(dir, corpus), CORPUS);
    const r = spawnSync(
      process.execPath,
      [BIN, "build-index", "--corpus", corpus, "--out", out, "--quiet"],
      {
        cwd: dir,
        encoding: "utf8",
        env: ENV,
      },
    );
    if (r.status !== 0) throw new Error(`setting up ${out}: ${r.stderr}`);
  };
}

const INPUTS: Input[] = [
  { when: /data\/FlashRAG_datasets/, make: flashrag },
  {
    when: /--corpus(_path)? \S*data\/wiki-18\.jsonl/,
    make: (d) => void put(join(d, "data", "wiki-18.jsonl"), CORPUS),
  },
  {
    when: /--corpus corpus\.jsonl\b(?!\.gz)/,
    make: (d) => void put(join(d, "corpus.jsonl"), CORPUS),
  },
  {
    when: /--corpus corpus\.jsonl\.gz/,
    make: (d) => void put(join(d, "corpus.jsonl.gz"), gzipSync(CORPUS)),
  },
  { when: /--index(_path)? \S*data\/bm25/, make: buildIndex("data/wiki-18.jsonl", "data/bm25") },
  { when: /--index idx\b/, make: buildIndex("corpus.jsonl", "idx") },
  // serve-retriever --replay-only: a search cache (empty) to replay from
  {
    when: /--search-cache \S*data\/search-cache\b.*--replay-only/,
    make: (d) => void mkdirSync(join(d, "data", "search-cache"), { recursive: true }),
  },
  // dense retrieval: the random BERT as the encoder; an index to serve comes with its
  // corpus (faiss-made files over the dense fixture corpus replace the generated one)
  {
    when: /--retriever_model \S*models\/e5-base-v2\b|--retriever-model \S*models\/e5-base-v2\b/,
    make: copy(join(RETRIEVAL, "bert", "model"), "models/e5-base-v2"),
  },
  // the reranker: the random BERT cross-encoder
  {
    when: /--reranker(_model)? \S*models\/ms-marco-MiniLM-L12-v2\b/,
    make: copy(join(RETRIEVAL, "cross-encoder", "model"), "models/ms-marco-MiniLM-L12-v2"),
  },
  {
    when: /^searchr1 serve-retriever .*--index(_path)? \S*data\/e5_(Flat|HNSW64)\.index\b/,
    make: (d, line) => {
      const hnsw = line.includes("e5_HNSW64.index");
      cpSync(join(RETRIEVAL, "dense", "corpus.jsonl"), join(d, "data", "wiki-18.jsonl"));
      cpSync(
        join(RETRIEVAL, "dense", hnsw ? "e5_HNSW.index" : "e5_Flat.index"),
        join(d, "data", hnsw ? "e5_HNSW64.index" : "e5_Flat.index"),
      );
    },
  },
  // convert: a Megatron checkpoint of the untied test model and that model as --hf-base,
  // a verl FSDP checkpoint root, a HF folder as the trainer writes it.
  {
    when: /--input ckpt\/actor\b/,
    make: copy(join(CKPT, "megatron", "tp2-pp1-te-untied"), "ckpt/actor"),
  },
  {
    when: /--hf-base models\/Qwen2\.5-3B\b/,
    make: copy(join(CKPT, "hf", "untied"), "models/Qwen2.5-3B"),
  },
  {
    when: /--input checkpoints\/nq\/global_step_300\/actor\b/,
    make: copy(join(CKPT, "fsdp", "ws2-dtensor-untied"), "checkpoints/nq"),
  },
  // a verl LoRA run's checkpoint (PEFT's names, lora_adapter/ beside the rank files)
  {
    when: /--input checkpoints\/nq-lora\/global_step_300\/actor\b/,
    make: copy(join(CKPT, "fsdp", "ws2-lora-untied"), "checkpoints/nq-lora"),
  },
  { when: /--input runs\/sft\/model\b/, make: copy(join(CKPT, "hf", "untied"), "runs/sft/model") },
  // a PEFT adapter of the native tests' untied model (its stand-in for Qwen2.5-0.5B-Instruct)
  {
    when: /--input runs\/nq\/global_step_100\/adapter\b/,
    make: (d) => {
      copy(join(NATIVE, "lora", "adapter"), "runs/nq/global_step_100/adapter")(d);
      copy(join(NATIVE, "untied"), "models/Qwen2.5-0.5B-Instruct")(d);
    },
  },
  // serve-engine --lora: that adapter (the model is the rule for models/Qwen2.5-0.5B-Instruct's)
  {
    when: /--lora \w+=runs\/nq\/global_step_100\/adapter\b/,
    make: copy(join(NATIVE, "lora", "adapter"), "runs/nq/global_step_100/adapter"),
  },
  // serve-engine: a tiny Qwen2 with a tokenizer.
  {
    when: /--model \S*models\/Qwen2\.5-3B-Instruct\b/,
    make: copy(join(CKPT, "hf", "untied"), "models/Qwen2.5-3B-Instruct"),
  },
  { when: /--model \.\/qwen\b/, make: copy(join(CKPT, "hf", "untied"), "qwen") },
  // searchr1-trainer: the tiny test model and its batch (input_ids, attention_mask,
  // weights, loss_mask).
  {
    when: /--model models\/Qwen2\.5-0\.5B-Instruct\b/,
    make: copy(join(NATIVE, "untied"), "models/Qwen2.5-0.5B-Instruct"),
  },
  {
    when: /--batch batch\.safetensors\b/,
    make: copy(join(NATIVE, "untied.case.safetensors"), "batch.safetensors"),
  },
  // a rollout batch for the PPO objective (response_mask, old/ref log-probs, advantages)
  {
    when: /--batch rollout\.safetensors\b/,
    make: copy(join(NATIVE, "ppo.batch.safetensors"), "rollout.safetensors"),
  },
  {
    when: /--data sft\.safetensors\b/,
    make: copy(join(NATIVE, "untied.case.safetensors"), "sft.safetensors"),
  },
  // eval and ask: the tiny model with a chat template, a test parquet made by preprocess,
  // and two finished eval runs to compare.
  {
    when: /^searchr1 (eval|ask|train) .*--model (\S*\/hf|quickstart\/trained|models\/Qwen2\.5-3B)\b/,
    make: (d, line) => {
      const m = /--model (\S+)/.exec(line) as RegExpExecArray;
      cpSync(AGENT_MODEL, join(d, m[1] as string), { recursive: true });
    },
  },
  {
    // the data files' defaults when an eval or train example names none
    when: /^searchr1 (eval (?!--compare)|train )/,
    make: (d) => {
      flashrag(d);
      const r = spawnSync(
        process.execPath,
        [
          BIN,
          "preprocess",
          "nq",
          "hotpotqa",
          "--input",
          "data/FlashRAG_datasets",
          "--out",
          "data/nq_hotpotqa",
          "--splits",
          "train,test",
          "--quiet",
        ],
        { cwd: d, encoding: "utf8", env: ENV },
      );
      if (r.status !== 0) throw new Error(`setting up data/nq_hotpotqa: ${r.stderr}`);
    },
  },
  // searchr1-index: faiss files written by faiss (test/retrieval/make_faiss_fixtures.py),
  // query vectors of the same dimension, and vectors to write.
  {
    when: /--(index|from) data\/e5_Flat\.index\b/,
    make: copy(join(FAISS, "flat-ip.index"), "data/e5_Flat.index"),
  },
  {
    when: /--index data\/e5_HNSW64\.index\b/,
    make: copy(join(FAISS, "hnsw-ip.index"), "data/e5_HNSW64.index"),
  },
  {
    when: /--queries q\.safetensors\b/,
    make: (d, line) => {
      const file = line.includes("HNSW")
        ? "hnsw-ip.expected.safetensors"
        : "flat-ip.expected.safetensors";
      cpSync(join(FAISS, file), join(d, "q.safetensors"));
    },
  },
  {
    when: /--vectors embeddings\.safetensors\b/,
    make: (d) => {
      mkdirSync(join(d, "data"), { recursive: true });
      cpSync(join(FAISS, "small.vectors.safetensors"), join(d, "embeddings.safetensors"));
    },
  },
  // searchr1-index encode: the small random BERT of test/retrieval/make_bert_fixtures.py and
  // its tokenized texts (input_ids and attention_mask, beside the reference embeddings).
  {
    when: /^searchr1-index encode .*--model models\/e5-base-v2\b/,
    make: copy(join(RETRIEVAL, "bert", "model"), "models/e5-base-v2"),
  },
  {
    when: /--input ids\.safetensors\b/,
    make: copy(join(RETRIEVAL, "bert", "expected.safetensors"), "ids.safetensors"),
  },
  // train's recipes, as shipped in the package
  {
    when: /--config templates\/configs\//,
    make: copy(join(PACKAGE, "templates"), "templates"),
  },
  {
    when: /--compare eval\/base eval\/step1000\b/,
    make: (d) => {
      for (const [run, em] of [
        ["base", 0],
        ["step1000", 1],
      ] as const) {
        const record = (id: string) => ({
          id,
          data_source: "nq",
          question: "q?",
          golden_answers: ["a"],
          prediction: em ? "a" : "b",
          em,
          subem: em,
          f1: em,
          response: "",
          turns: [],
          searches: 1,
          invalid_actions: 0,
          response_tokens: 5,
          finish_reason: "answer",
        });
        put(
          join(d, "eval", run, "trajectories.jsonl"),
          jsonl([record("test_0"), record("test_1")]),
        );
      }
    },
  },
  // config --from-script: Search-R1's script as a clone of its repository holds it.
  {
    when: /--from-script Search-R1\/scripts\/nq_hotpotqa\/v0\.2\/train_grpo\.sh\b/,
    make: (d) => {
      const dir = join(d, "Search-R1", "scripts", "nq_hotpotqa", "v0.2");
      mkdirSync(dir, { recursive: true });
      cpSync(
        join(PACKAGE, "test", "train", "fixtures", "search-r1", "v0.2-train_grpo.sh"),
        join(dir, "train_grpo.sh"),
      );
    },
  },
  // config: a train config of the user's own, with the one key that has no default.
  {
    when: /--config run\.yaml\b/,
    make: (d) => void writeFileSync(join(d, "run.yaml"), "model:\n  path: models/Qwen2.5-3B\n"),
  },
];

interface Example {
  command: string;
  line: string;
}
const EXAMPLES: Example[] = HELP_TEXTS.flatMap((h) =>
  h.examples.map((line) => ({ command: h.command, line })),
);

interface Run {
  code: number | null;
  output: string;
}

function shell(line: string, cwd: string): ChildProcess {
  return spawn("bash", ["-c", `set -o pipefail; ${line}`], { cwd, env: ENV });
}

function finish(child: ChildProcess, collect: { output: string }): Promise<Run> {
  const add = (d: string) => {
    collect.output += d;
  };
  child.stdout?.setEncoding("utf8").on("data", add);
  child.stderr?.setEncoding("utf8").on("data", add);
  return new Promise((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, output: collect.output }));
  });
}

async function runServer(line: string, cwd: string): Promise<Run> {
  // exec: the signal goes to the server itself, not to the shell around it.
  const child = shell(`exec ${line} port=0`, cwd);
  const collect = { output: "" };
  const done = finish(child, collect);
  const deadline = Date.now() + 90_000;
  let healthy = false;
  while (!healthy && Date.now() < deadline && child.exitCode === null) {
    const url = /(https?:\/\/[^\s/]+)/.exec(collect.output)?.[1];
    if (url)
      healthy = await fetch(`${url}/health`).then(
        (r) => r.ok,
        () => false,
      );
    if (!healthy) await new Promise((r) => setTimeout(r, 200));
  }
  child.kill("SIGTERM");
  const run = await done;
  if (!healthy) return { code: -1, output: `never healthy:\n${run.output}` };
  return run;
}

/** A BM25 retriever and an engine serving the tiny model, shared by the agent examples. */
let servers: Promise<{ retriever: string; engine: string }> | null = null;
const serverChildren: ChildProcess[] = [];
afterAll(() => {
  for (const child of serverChildren) child.kill("SIGTERM");
});

function agentServers(): Promise<{ retriever: string; engine: string }> {
  servers ??= (async () => {
    const dir = join(root, "agent-servers");
    mkdirSync(dir);
    buildIndex("corpus.jsonl", "idx")(dir);
    const start = (args: string[], ready: RegExp) =>
      new Promise<string>((resolve, reject) => {
        const child = spawn(process.execPath, [BIN, ...args, "--port", "0"], {
          cwd: dir,
          env: ENV,
        });
        serverChildren.push(child);
        let output = "";
        child.stderr.setEncoding("utf8").on("data", (d: string) => {
          output += d;
          const m = ready.exec(output);
          if (m) resolve(m[1] as string);
        });
        child.on("close", (code) => reject(new Error(`${args[0]} exited ${code}: ${output}`)));
      });
    const [retriever, engine] = await Promise.all([
      start(
        ["serve-retriever", "--index", "idx", "--corpus", "corpus.jsonl"],
        /serving .* at (http:\/\/\S+\/retrieve) /,
      ),
      start(
        ["serve-engine", "--model", AGENT_MODEL, "--device", "cpu", "--threads", "1"],
        /serving .* at (http:\/\/\S+) /,
      ),
    ]);
    return { retriever, engine };
  })();
  return servers;
}

function ruleFor(line: string): Rule | undefined {
  return RULES.find((r) => r.match.test(line) && !("skip" in r && r.skip === ""));
}

let n = 0;
async function runExample(line: string): Promise<Run & { rule?: Rule }> {
  const dir = join(root, `example-${++n}`);
  mkdirSync(dir);
  const rooted = line.replace(ABSOLUTE, (_m, pre: string, top: string) => `${pre}${dir}/${top}/`);
  for (const input of INPUTS) {
    if (input.when.test(rooted)) await input.make(dir, rooted);
  }
  const rule = ruleFor(line);
  if (rule && "server" in rule) return { ...(await runServer(rooted, dir)), rule };
  if (rule && "agent" in rule && rule.overrides.length > 0) {
    const { retriever, engine } = await agentServers();
    const pointed = rooted.replace("http://127.0.0.1:30000", engine);
    const args = [...rule.overrides, `retriever.url=${retriever}`].join(" ");
    return { ...(await finish(shell(`${pointed} ${args}`, dir), { output: "" })), rule };
  }
  return { ...(await finish(shell(rooted, dir), { output: "" })), rule };
}

describe("help texts", () => {
  it("list their examples, and every command has at least one", () => {
    const without = HELP_TEXTS.filter(
      (h) => h.examples.length === 0 && h.command !== "searchr1",
    ).map((h) => h.command);
    expect(without).toEqual([]);
    expect(HELP_TEXTS.map((h) => h.command)).toEqual(
      expect.arrayContaining(["searchr1 preprocess", "searchr1-trainer sft"]),
    );
  });

  it("name only files that searchr1 ships when they name one (templates/...)", () => {
    const shipped = EXAMPLES.flatMap((e) => e.line.split(/[\s=]+/)).filter((t) =>
      t.startsWith("templates/"),
    );
    expect(shipped.filter((t) => !existsSync(join(PACKAGE, t)))).toEqual([]);
  });

  it("have no rule that matches no example (the list of exceptions stays true)", () => {
    const unused = RULES.filter((r) => !EXAMPLES.some((e) => r.match.test(e.line)));
    expect(unused.map((r) => String(r.match))).toEqual([]);
  });
});

describe.each(HELP_TEXTS.filter((h) => h.examples.length > 0))(
  "$command --help",
  ({ examples }) => {
    for (const line of examples) {
      const rule = ruleFor(line);
      if (rule && "skip" in rule) {
        it.skip(`${line}  [skipped: ${rule.skip}]`, () => {});
        continue;
      }
      it(line, { timeout: 180_000 }, async () => {
        const r = await runExample(line);
        expect(r.code, r.output).toBe(0);
      });
    }
  },
);
