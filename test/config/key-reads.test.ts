// Every key of every command's schema does something: each command runs here for real with
// every key set (to a value other than its default wherever the run allows it), recording
// the keys it reads (SEARCHR1_KEY_READS, src/config/key-reads.ts); a key that no run reads
// must be declared compatibility-only in its command's `compat` list, which warns when set.
// The quickstart's keys are checked by test/quickstart/quickstart.test.ts on its own run.
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { leafPaths } from "../../src/config/schema-walk.js";
import { askSpec } from "../../src/config/schemas/ask.js";
import { buildIndexSpec } from "../../src/config/schemas/build-index.js";
import { convertCkptSpec } from "../../src/config/schemas/convert-ckpt.js";
import { downloadSpec } from "../../src/config/schemas/download.js";
import { evalSpec } from "../../src/config/schemas/eval.js";
import { preprocessSpec } from "../../src/config/schemas/preprocess.js";
import { serveEngineSpec } from "../../src/config/schemas/serve-engine.js";
import { serveRetrieverSpec } from "../../src/config/schemas/serve-retriever.js";
import { trainSpec } from "../../src/config/schemas/train.js";
import { TOOL_CONFIG, writeHermesModel } from "../agent/hermes-model.js";
import { modelDir } from "../engine/helpers.js";
import { runCli, startCli, startServing } from "../helpers/cli.js";
import { createHubServer } from "../helpers/hub-server.js";
import { expectEveryKeyRead, keyReadsEnv } from "../helpers/key-reads.js";
import { preprocessQa, type QaRow } from "../helpers/qa-data.js";
import { buildTestIndex, type TestIndex } from "../retrieval/helpers.js";

const FIXTURES = fileURLToPath(new URL("../", import.meta.url));
const BERT = path.join(FIXTURES, "retrieval/fixtures/bert/model");
const DENSE = path.join(FIXTURES, "retrieval/fixtures/dense");
const MODEL = modelDir("qwen-bpe");

let dir: string;
let data: { train: string; test: string };
/** Short prompts, for the Hermes format's tools-aware model (test/agent/hermes-model.ts). */
let hermesData: { train: string; test: string };
let hermesModel: string;
let ix: TestIndex;

const rows = (split: string, n: number): QaRow[] =>
  Array.from({ length: n }, (_, i) => ({
    id: `${split}_${i}`,
    question: `who is paul walker number ${i}`,
    golden_answers: ["an actor"],
  }));

beforeAll(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), "searchr1-key-reads-"));
  data = preprocessQa(dir, {
    nq: { train: rows("train", 4), test: rows("test", 2) },
    hotpotqa: { test: rows("test", 2) },
  });
  hermesData = preprocessQa(
    path.join(dir, "hermes"),
    { nq: { train: rows("train", 2), test: rows("test", 2) } },
    { template: path.join(FIXTURES, "agent/fixtures/question-prompt.txt") },
  );
  hermesModel = path.join(dir, "hermes-model");
  mkdirSync(hermesModel);
  await writeHermesModel(hermesModel);
  ix = buildTestIndex({ rows: 200 });
}, 60_000);

afterAll(() => {
  ix?.cleanup();
  rmSync(dir, { recursive: true, force: true });
});

/** A fresh record file for one command's runs. */
function recordFor(command: string): string {
  return path.join(dir, `${command}.reads.jsonl`);
}

async function run(record: string, args: string[]): Promise<void> {
  const r = await startCli(args, { env: keyReadsEnv(record) }).result;
  expect(r.code, `${args.join(" ")}\n${r.stderr.slice(-2000)}`).toBe(0);
}

describe("every key of every command is read", () => {
  it("preprocess", async () => {
    const record = recordFor("preprocess");
    await run(record, [
      "preprocess",
      "nq",
      "--input",
      path.join(dir, "flashrag"),
      "--out",
      path.join(dir, "pre"),
      "splits=[test]",
      "template=r1-no-search",
      "strict=true",
      "overwrite=true",
      "quiet=true",
    ]);
    expectEveryKeyRead(preprocessSpec, record);
  });

  it("build-index (bm25 and e5)", async () => {
    const record = recordFor("build-index");
    await run(record, [
      "build-index",
      "--corpus",
      ix.corpus,
      "--out",
      path.join(dir, "bm25"),
      "bm25.k1=1.2",
      "bm25.b=0.5",
      "threads=1",
      "memory_mb=64",
      "overwrite=true",
      "quiet=true",
    ]);
    await run(record, [
      "build-index",
      "--retriever",
      "e5",
      "--corpus",
      path.join(DENSE, "corpus.jsonl"),
      "--out",
      path.join(dir, "e5_HNSW8.index"),
      `retriever_model=${BERT}`,
      "pooling=cls",
      "max_length=32",
      "device=cpu",
      "faiss_type=HNSW8",
      "ef_construction=16",
      "batch_size=8",
      "threads=1",
      "quiet=true",
    ]);
    expectEveryKeyRead(buildIndexSpec, record);
  }, 120_000);

  it("serve-retriever (bm25, dense and web search)", async () => {
    const record = recordFor("serve-retriever");
    const serving = /serving \S+ retrieval over .* at (http:\/\/\S+\/retrieve)/;
    const env = keyReadsEnv(record);
    const bm25 = await startServing(
      [
        "serve-retriever",
        "--index",
        ix.index,
        "--corpus",
        ix.corpus,
        "--port",
        "0",
        "host=127.0.0.1",
        "topk=2",
        "threads=1",
        "max_queries=16",
        "max_topk=8",
        "max_body_mb=1",
        `corpus_cache=${path.join(dir, "corpus-cache")}`,
        `reranker=${path.join(FIXTURES, "retrieval/fixtures/cross-encoder/model")}`,
        "retrieval_topk=4",
        "rerank_topk=2",
        "reranker_batch_size=8",
      ],
      serving,
      { env, timeoutMs: 30_000 },
    );
    expect((await bm25.stop()).code).toBe(0);
    const dense = await startServing(
      [
        "serve-retriever",
        "--retriever",
        "e5",
        "--index",
        path.join(DENSE, "e5_HNSW.index"),
        "--corpus",
        path.join(DENSE, "corpus.jsonl"),
        "--port",
        "0",
        `retriever_model=${BERT}`,
        "pooling=mean",
        "max_length=32",
        "device=cpu",
        "ef_search=32",
        "fp16=true",
        "faiss_gpu=false",
        "gpus=1",
      ],
      serving,
      { env, timeoutMs: 60_000 },
    );
    expect((await dense.stop()).code).toBe(0);
    // Web search: the engine's keys are read when the server starts (no search is needed).
    const online = await startServing(
      [
        "serve-retriever",
        "--retriever",
        "serpapi",
        "--port",
        "0",
        "search_url=http://127.0.0.1:9/search",
        "serp_engine=bing",
        `search_cache=${path.join(dir, "search-cache")}`,
        "search_cache_days=1",
        "replay_only=false",
        "search_timeout_s=5",
        "search_retries=1",
        "search_backoff_s=0.1",
        "search_concurrency=2",
      ],
      /serving serpapi web search at (http:\/\/\S+\/retrieve)/,
      { env: { ...env, SERPAPI_API_KEY: "key-reads" }, timeoutMs: 30_000 },
    );
    expect((await online.stop()).code).toBe(0);
    expectEveryKeyRead(serveRetrieverSpec, record);
  }, 120_000);

  it("serve-engine", async () => {
    const record = recordFor("serve-engine");
    const engine = await startServing(
      [
        "serve-engine",
        "--model",
        MODEL,
        "--port",
        "0",
        "host=127.0.0.1",
        "device=cpu",
        "threads=1",
        "context_length=256",
        "kv_cache_mb=4",
        "gpu_memory_utilization=0.5",
        "enforce_eager=true",
        "max_running=4",
        "chunk_tokens=64",
        "skip_tokenizer_init=true",
        "max_body_mb=1",
      ],
      /serving .* at (http:\/\/\S+)/,
      { env: keyReadsEnv(record), timeoutMs: 30_000 },
    );
    expect((await engine.stop()).code).toBe(0);
    expectEveryKeyRead(serveEngineSpec, record);
  }, 60_000);

  it("convert-ckpt", async () => {
    const record = recordFor("convert-ckpt");
    await run(record, [
      "convert",
      "fsdp-to-hf",
      "--input",
      path.join(FIXTURES, "ckpt/fixtures/fsdp/ws1-tied"),
      "--out",
      path.join(dir, "converted"),
      `hf_base=${path.join(FIXTURES, "ckpt/fixtures/fsdp/ws1-tied/global_step_300/actor/huggingface")}`,
      "dtype=fp32",
      "max_shard_size=1MB",
      "keep_config=true",
      "verify=true",
      "overwrite=true",
      "quiet=true",
    ]);
    expectEveryKeyRead(convertCkptSpec, record);
  });

  it("download", async () => {
    const record = recordFor("download");
    const hub = await createHubServer({
      repos: [
        {
          id: "PeterJinGo/wiki-18-e5-index",
          type: "dataset",
          files: [
            { path: "part_aa", content: Buffer.from("first half|") },
            { path: "part_ab", content: Buffer.from("second half") },
          ],
        },
        {
          id: "PeterJinGo/wiki-18-corpus",
          type: "dataset",
          files: [{ path: "wiki-18.jsonl.gz", content: gzipSync('{"id":"0","contents":"x"}\n') }],
        },
        {
          id: "org/model",
          type: "model",
          files: [
            { path: "config.json", content: Buffer.from('{"model_type":"qwen2"}\n') },
            { path: "model.safetensors", content: Buffer.alloc(64) },
          ],
        },
      ],
      token: "secret",
    });
    try {
      const common = [
        "download",
        "--save-path",
        path.join(dir, "downloads"),
        `endpoint=${hub.url}`,
        "token=secret",
        "revision=main",
        "connections=2",
        "parallel_files=2",
        "piece_mb=1",
        "retries=1",
        "backoff_s=0.01",
        "timeout_s=5",
        "keep_parts=true",
        "keep_gz=true",
        "quiet=true",
        "progress_s=1",
      ];
      await run(record, [...common, "repo=org/model", "repo_type=model", "include=[*.json]"]);
      await run(record, [...common, "what=[e5-flat,corpus]"]);
      await run(record, [...common, "what=[model:org/model]", "dry_run=true"]);
    } finally {
      await hub.close();
    }
    expectEveryKeyRead(downloadSpec, record);
  });

  /** Budgets small enough for the fixture model's 512 tokens and two shared cores. */
  const AGENT = [
    "data.max_start_length=300",
    "data.max_prompt_length=400",
    "data.max_response_length=8",
    "data.max_obs_length=24",
    "rollout.max_turns=1",
    "rollout.engine=native",
    "rollout.engine_device=cpu",
    "rollout.engine_threads=1",
    "rollout.temperature=0.9",
    "rollout.top_p=0.95",
    "rollout.top_k=20",
    "rollout.compat=none",
    "rollout.gpu_memory_utilization=0.5",
    "rollout.enforce_eager=true",
    "rollout.tensor_parallel_size=1",
    `model.tokenizer_path=${MODEL}`,
    "retriever.topk=2",
    "retriever.timeout_s=10",
    "retriever.max_retries=1",
  ];

  /**
   * The Hermes format (rollout.multi_turn.*) on the tools-aware model, every key off its
   * default; budgets for its 512 positions (a prompt with its tools is ~370 tokens).
   */
  const HERMES = [
    "rollout.multi_turn.format=hermes",
    `rollout.multi_turn.tool_config_path=${TOOL_CONFIG}`,
    "rollout.multi_turn.max_assistant_turns=2",
    "rollout.multi_turn.max_parallel_calls=2",
    "rollout.multi_turn.max_tool_response_length=60",
    "rollout.multi_turn.tool_response_truncate_side=left",
    "data.max_start_length=400",
    "data.max_prompt_length=500",
    "data.max_response_length=150",
    "rollout.engine_device=cpu",
    "rollout.engine_threads=1",
  ];

  it("eval and ask", async () => {
    const served = await startServing(
      ["serve-retriever", "--index", ix.index, "--corpus", ix.corpus, "--port", "0"],
      /serving \S+ retrieval over .* at (http:\/\/\S+\/retrieve)/,
      { timeoutMs: 30_000 },
    );
    try {
      const retriever = `retriever.url=${served.url}`;
      const evalRecord = recordFor("eval");
      await run(evalRecord, [
        "eval",
        "--model",
        MODEL,
        `data.val_files=[${data.test}]`,
        "data.val_batch_size=2",
        "data.max_samples=2",
        "data.limit=3",
        "data.sources=[nq,hotpotqa]",
        "rollout.do_sample=true",
        "rollout.seed=7",
        "reward.search_r1_extract=true",
        "gpus=1",
        `output_dir=${path.join(dir, "eval")}`,
        retriever,
        ...AGENT,
      ]);
      await run(evalRecord, [
        "eval",
        "--model",
        hermesModel,
        `data.val_files=[${hermesData.test}]`,
        `output_dir=${path.join(dir, "eval-hermes")}`,
        retriever,
        ...HERMES,
      ]);
      expectEveryKeyRead(evalSpec, evalRecord);
      const askRecord = recordFor("ask");
      await run(askRecord, [
        "ask",
        "who is paul walker",
        "--model",
        MODEL,
        "template=r1-no-search",
        "rollout.do_sample=true",
        "rollout.seed=7",
        "json=true",
        retriever,
        ...AGENT,
      ]);
      await run(askRecord, [
        "ask",
        "who is paul walker",
        "--model",
        hermesModel,
        `template=${path.join(FIXTURES, "agent/fixtures/question-prompt.txt")}`,
        retriever,
        ...HERMES,
      ]);
      expectEveryKeyRead(askSpec, askRecord);
    } finally {
      await served.stop();
    }
  }, 240_000);

  it("train (GRPO with rollout correction and overlong shaping, GRPO with LoRA, then PPO with an adaptive in-reward KL and dynamic sampling)", async () => {
    const record = recordFor("train");
    const common = [
      "train",
      "--model",
      MODEL,
      `data.train_files=[${data.train}]`,
      `data.val_files=[${data.test}]`,
      "data.train_batch_size=2",
      "data.val_batch_size=2",
      "data.val_max_samples=1",
      "data.shuffle=false",
      "data.seed=3",
      "rollout.n=2",
      "rollout.log_prob_micro_batch_size=2",
      "actor.ppo_mini_batch_size=1",
      "actor.ppo_micro_batch_size=1",
      "actor.ppo_epochs=2",
      "actor.lr=1e-4",
      "actor.lr_warmup_steps_ratio=0.5",
      "actor.lr_scheduler=cosine",
      "actor.weight_decay=0.1",
      "actor.betas=[0.8,0.99]",
      "actor.grad_clip=0.5",
      "actor.clip_ratio=0.3",
      "actor.entropy_coeff=0.01",
      "actor.kl_loss_type=kl",
      "actor.kl_loss_coef=0.01",
      "actor.loss_agg_mode=seq-mean-token-mean",
      "actor.state_masking=false",
      "actor.gradient_checkpointing=false",
      "reward.format_reward=true",
      "reward.structure_format_score=0.3",
      "reward.final_format_score=0.2",
      "reward.retrieval_score=0.1",
      "reward.search_r1_extract=true",
      "trainer.gpus=1",
      "trainer.nnodes=1",
      "trainer.device=cpu",
      "trainer.threads=1",
      "trainer.save_freq=2",
      "trainer.test_freq=2",
      "trainer.val_before_train=false",
      "trainer.project_name=reads",
      "trainer.resume=disable",
      "trainer.logger=[console,jsonl,tensorboard]",
      "trainer.log_every=2",
      "trainer.stop_on_nan=false",
      `trainer.output_dir=${path.join(dir, "runs")}`,
      ...AGENT,
    ];
    // GRPO starts its retriever from retriever.index; PPO uses one already serving.
    await run(record, [
      ...common,
      `retriever.index=${ix.index}`,
      `retriever.corpus=${ix.corpus}`,
      "retriever.kind=bm25",
      "algorithm.name=grpo",
      "algorithm.norm_adv_by_std_in_grpo=false",
      "algorithm.rollout_correction.rollout_is=sequence",
      "algorithm.rollout_correction.rollout_is_threshold=3",
      "algorithm.rollout_correction.rollout_is_batch_normalize=true",
      "algorithm.rollout_correction.rollout_rs=token_k1,seq_max_k3",
      "algorithm.rollout_correction.rollout_rs_threshold=0.5_2,3",
      "actor.clip_ratio_low=0.1",
      "actor.clip_ratio_high=0.28",
      "reward.overlong_buffer.enable=true",
      "reward.overlong_buffer.len=4",
      "reward.overlong_buffer.penalty_factor=0.5",
      "trainer.total_training_steps=2",
      "trainer.experiment_name=grpo",
      "trainer.zero_stage=1",
      "trainer.profile=true",
      "ref.param_offload=true",
      "actor.param_offload=true",
      "actor.grad_offload=true",
      "actor.optimizer_offload=true",
      // Search-R1's repeat on top of verl's n (groups of 4), micro-batches by tokens.
      "rollout.n_agent=2",
      "actor.use_dynamic_bsz=true",
      "actor.ppo_max_token_len_per_gpu=4096",
      "rollout.log_prob_micro_batch_size_per_gpu=3",
      "ref.log_prob_micro_batch_size=4",
      "ref.log_prob_use_dynamic_bsz=true",
      "ref.log_prob_max_token_len_per_gpu=2048",
    ]);
    // LoRA (model.lora_*): a fresh adapter, then a run starting from the adapter it saved.
    const lora = [
      ...common,
      `retriever.index=${ix.index}`,
      `retriever.corpus=${ix.corpus}`,
      "trainer.total_training_steps=1",
      "model.lora_alpha=4",
      "model.use_rslora=true",
      "model.target_modules=[q_proj,o_proj,gate_proj]",
      "model.exclude_modules=[gate_proj]",
    ];
    await run(record, [...lora, "model.lora_rank=2", "trainer.experiment_name=lora"]);
    await run(record, [
      ...lora,
      `model.lora_adapter_path=${path.join(dir, "runs", "reads", "lora", "global_step_1", "adapter")}`,
      "trainer.experiment_name=lora-from-adapter",
    ]);
    // --dry-run prints the memory plan and stops (starts and writes nothing).
    await run(record, [...common, "--dry-run", "trainer.device_memory_gib=40"]);
    const served = await startServing(
      ["serve-retriever", "--index", ix.index, "--corpus", ix.corpus, "--port", "0"],
      /serving \S+ retrieval over .* at (http:\/\/\S+\/retrieve)/,
      { timeoutMs: 30_000 },
    );
    try {
      await run(record, [
        ...common,
        `retriever.url=${served.url}`,
        "algorithm.name=ppo",
        "algorithm.gamma=0.99",
        "algorithm.lam=0.95",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_penalty=low_var_kl",
        "algorithm.kl_coef=0.01",
        "algorithm.kl_ctrl=adaptive",
        "algorithm.target_kl=0.05",
        "algorithm.kl_horizon=100",
        `critic.model_path=${MODEL}`,
        "critic.param_offload=true",
        "critic.grad_offload=true",
        "critic.optimizer_offload=true",
        "critic.lr=1e-4",
        "critic.lr_warmup_steps_ratio=0.5",
        "critic.ppo_micro_batch_size=2",
        "critic.ppo_mini_batch_size=2",
        "critic.ppo_micro_batch_size_per_gpu=1",
        "actor.ppo_micro_batch_size_per_gpu=1",
        "critic.use_dynamic_bsz=true",
        "critic.ppo_max_token_len_per_gpu=4096",
        "critic.forward_max_token_len_per_gpu=2048",
        "rollout.log_prob_use_dynamic_bsz=true",
        "rollout.log_prob_max_token_len_per_gpu=3000",
        "critic.cliprange_value=0.3",
        "critic.grad_clip=0.5",
        "critic.weight_decay=0.1",
        "actor.use_kl_loss=false",
        // Groups of one trajectory are always kept: the random model's rewards never vary.
        "rollout.n=1",
        "rollout.free_cache_engine=false",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=score",
        "algorithm.filter_groups.max_num_gen_batches=3",
        "trainer.total_training_steps=null",
        "trainer.total_epochs=1",
        "trainer.experiment_name=ppo",
        `trainer.default_local_dir=${path.join(dir, "runs", "ppo-here")}`,
      ]);
      // trainer.val_only: one validation in that run folder, no step trained.
      await run(record, [
        ...common,
        `retriever.url=${served.url}`,
        "trainer.val_only=true",
        `trainer.default_local_dir=${path.join(dir, "runs", "ppo-here")}`,
      ]);
      // The Hermes format: verl's tool agent, scored as verl scores it.
      await run(record, [
        "train",
        "--model",
        hermesModel,
        `data.train_files=[${hermesData.train}]`,
        `data.val_files=[${hermesData.test}]`,
        "data.train_batch_size=2",
        "rollout.n=2",
        "actor.ppo_mini_batch_size=2",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.device=cpu",
        "trainer.threads=1",
        `trainer.output_dir=${path.join(dir, "runs-hermes")}`,
        `retriever.url=${served.url}`,
        ...HERMES,
      ]);
    } finally {
      await served.stop();
    }
    expectEveryKeyRead(trainSpec, record);
  }, 600_000);
});

describe("compatibility-only keys", () => {
  it("warn when set, naming the key, and the run goes on to its own end", () => {
    const missing = path.join(dir, "missing.parquet");
    const r = runCli([
      "train",
      "--model",
      MODEL,
      "model.dtype=fp16",
      `data.train_files=[${missing}]`,
    ]);
    expect(r.stderr).toMatch(/warning: model\.dtype="fp16" has no effect in searchr1 train/);
    expect(r.stderr).toContain(missing);
    expect(r.code).not.toBe(0);
    const quiet = runCli(["train", "--model", MODEL, `data.train_files=[${missing}]`]);
    expect(quiet.stderr).not.toMatch(/warning/);
  });

  it("are keys of their command's schema", () => {
    for (const spec of [trainSpec, evalSpec, askSpec]) {
      const keys = new Set(leafPaths(spec.schema).map((p) => p.join(".")));
      expect(Object.keys(spec.compat ?? {}).filter((k) => !keys.has(k))).toEqual([]);
      expect(Object.keys(spec.compat ?? {})).toContain("model.dtype");
    }
  });
});
