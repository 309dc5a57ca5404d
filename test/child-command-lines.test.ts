// Every `searchr1 <command>` this package starts as a child process (the engine and the
// retriever of eval/train/ask, the quickstart's steps) is given arguments that the callee's
// own config parser reads back to the values meant: the command lines are built by the same
// functions the call sites use, with realistic inputs, and resolved by the callee's spec.
import path from "node:path";
import { describe, expect, it } from "vitest";
import { engineChildValues, retrieverChildLine } from "../src/agent/session.js";
import { resolveConfig } from "../src/config/resolve.js";
import { evalSpec } from "../src/config/schemas/eval.js";
import { quickstartSpec } from "../src/config/schemas/quickstart.js";
import { trainSpec } from "../src/config/schemas/train.js";
import { engineChildLine, engineChildLines } from "../src/engine/client/connect.js";
import { quickstartSteps, SFT } from "../src/quickstart/steps.js";
import { packageRoot } from "../src/runtime/package-root.js";
import { DATA_SOURCES } from "../src/world/questions.js";
import { resolveLine } from "./helpers/command-line.js";

const LISTEN = { host: "127.0.0.1", port: 0 };

describe("the retriever train starts from retriever.index (AgentSession)", () => {
  it("serves the index with its kind, encoder, corpus and topk", () => {
    const config = resolveConfig(trainSpec, {
      overrides: [
        "model.path=/m",
        'retriever.index="/data/my index/e5_Flat.index"',
        "retriever.kind=e5",
        'retriever.model="/models/e5, base"',
        'retriever.corpus="/data/wiki [18].jsonl"',
        "retriever.topk=5",
      ],
    });
    const line = retrieverChildLine(config.retriever);
    expect(line?.command).toBe("serve-retriever");
    expect(resolveLine(line ?? { command: "", args: [] })).toMatchObject({
      retriever: "e5",
      index: "/data/my index/e5_Flat.index",
      retriever_model: "/models/e5, base",
      corpus: "/data/wiki [18].jsonl",
      topk: 5,
      ...LISTEN,
    });
  });

  it("leaves a missing corpus for serve-retriever to report, and starts nothing without an index", () => {
    const config = resolveConfig(trainSpec, {
      overrides: ["model.path=/m", "retriever.index=/data/bm25"],
    });
    const line = retrieverChildLine(config.retriever);
    expect(resolveLine(line ?? { command: "", args: [] }, { draft: true })).toMatchObject({
      retriever: "bm25",
      index: "/data/bm25",
      corpus: null,
      retriever_model: null,
      topk: 3,
    });
    const plain = resolveConfig(trainSpec, { overrides: ["model.path=/m"] });
    expect(retrieverChildLine(plain.retriever)).toBeNull();
  });
});

describe("the native engine eval, ask and train start (connectEngine)", () => {
  it("gets the model, the rollout's device, threads, GPU memory share and enforce_eager", () => {
    const config = resolveConfig(evalSpec, {
      overrides: [
        "rollout.engine_device=cpu",
        "rollout.engine_threads=3",
        "rollout.gpu_memory_utilization=0.45",
        "rollout.enforce_eager=true",
      ],
    });
    const line = engineChildLine({
      modelPath: "/models/Qwen 2.5, 3B",
      child: engineChildValues(config.rollout),
    });
    expect(line.command).toBe("serve-engine");
    expect(resolveLine(line)).toMatchObject({
      model: "/models/Qwen 2.5, 3B",
      device: "cpu",
      threads: 3,
      gpu_memory_utilization: 0.45,
      enforce_eager: true,
      ...LISTEN,
    });
  });

  it("keeps the engine's own defaults where the rollout sets nothing", () => {
    const config = resolveConfig(trainSpec, { overrides: ["model.path=/m"] });
    const line = engineChildLine({ modelPath: "/m", child: engineChildValues(config.rollout) });
    expect(resolveLine(line)).toMatchObject({
      model: "/m",
      device: "auto",
      threads: null,
      gpu_memory_utilization: 0.6,
      enforce_eager: false,
    });
  });
});

describe("the engine replicas of train --gpus N (connectEngine)", () => {
  it("starts one serve-engine per device, each seeing only its own, sharing the threads", () => {
    const config = resolveConfig(trainSpec, {
      overrides: [
        "model.path=/m",
        "trainer.gpus=2",
        "rollout.engine_threads=5",
        "rollout.gpu_memory_utilization=0.4",
      ],
    });
    const lines = engineChildLines({
      modelPath: "/models/Qwen 2.5, 3B",
      child: { ...engineChildValues(config.rollout), device: "cuda" },
      replicas: 2,
      devices: ["4", "5"],
    });
    expect(lines.map((l) => l.command)).toEqual(["serve-engine", "serve-engine"]);
    expect(lines.map((l) => l.env)).toEqual([
      { CUDA_VISIBLE_DEVICES: "4" },
      { CUDA_VISIBLE_DEVICES: "5" },
    ]);
    for (const line of lines) {
      expect(resolveLine(line)).toMatchObject({
        model: "/models/Qwen 2.5, 3B",
        device: "cuda",
        threads: 2,
        gpu_memory_utilization: 0.4,
        ...LISTEN,
      });
    }
  });

  it("CPU replicas share the cores and keep the environment; one replica is the plain line", () => {
    const config = resolveConfig(trainSpec, {
      overrides: ["model.path=/m", "rollout.engine_device=cpu", "rollout.engine_threads=1"],
    });
    const child = engineChildValues(config.rollout);
    const lines = engineChildLines({ modelPath: "/m", child, replicas: 2, devices: null });
    expect(lines).toHaveLength(2);
    for (const line of lines) {
      expect(line.env).toBeUndefined();
      expect(resolveLine(line)).toMatchObject({ device: "cpu", threads: 1 });
    }
    expect(engineChildLines({ modelPath: "/m", child })).toEqual([
      engineChildLine({ modelPath: "/m", child }),
    ]);
  });
});

describe("the quickstart's steps", () => {
  const url = "http://127.0.0.1:41234";
  for (const overrides of [
    [],
    ["dir=qs dir,[1]", "threads=2", "train_steps=8", "algorithm=ppo", "seed=3"],
  ]) {
    it(`run as meant with ${overrides.join(" ") || "the defaults"}`, () => {
      const config = resolveConfig(quickstartSpec, { overrides });
      const steps = quickstartSteps(config);
      const dir = path.resolve(config.dir);
      const at = (...parts: string[]) => path.join(dir, ...parts);
      expect(steps.dir).toBe(dir);
      expect(resolveLine(steps.preprocess)).toMatchObject({
        datasets: [...DATA_SOURCES],
        input: at("world", "datasets"),
        out: at("data"),
        splits: ["train", "test"],
        overwrite: true,
      });
      expect(resolveLine(steps.buildIndex)).toMatchObject({
        retriever: "bm25",
        corpus: at("world", "corpus.jsonl"),
        out: at("bm25"),
        overwrite: true,
      });
      expect(resolveLine(steps.retriever)).toMatchObject({
        index: at("bm25"),
        corpus: at("world", "corpus.jsonl"),
        ...LISTEN,
      });
      const budgets = {
        data: { max_prompt_length: 900, max_response_length: 64, max_obs_length: 256 },
        rollout: { max_turns: 2, engine_threads: config.threads },
        retriever: { topk: 1, url },
      };
      const evaluate = steps.evaluate(at("models", "warm"), at("eval-before"), url);
      expect(resolveLine(evaluate)).toMatchObject({
        ...budgets,
        model: { path: at("models", "warm") },
        data: { ...budgets.data, val_files: [at("data", "test.parquet")] },
        output_dir: at("eval-before"),
      });
      const train = steps.train(url);
      expect(train.args.slice(0, 2)).toEqual([
        "--config",
        path.join(packageRoot(), "templates", "configs", "quickstart.yaml"),
      ]);
      expect(resolveLine(train)).toMatchObject({
        ...budgets,
        model: { path: at("models", "warm") },
        algorithm: { name: config.algorithm },
        data: {
          ...budgets.data,
          train_files: [at("data", "train.parquet")],
          val_files: [at("data", "test.parquet")],
          seed: config.seed,
          train_batch_size: 16, // from quickstart.yaml
        },
        trainer: {
          output_dir: at("runs"),
          project_name: "quickstart",
          experiment_name: config.algorithm,
          resume: "disable",
          threads: config.threads,
          total_training_steps: config.train_steps ?? 40,
          save_freq: config.train_steps ?? 40,
        },
      });
      const sft = steps.sft("/from", "/data.safetensors", "/out", SFT);
      expect(sft.slice(0, 7)).toEqual([
        "sft",
        "--model",
        "/from",
        "--data",
        "/data.safetensors",
        "--out",
        "/out",
      ]);
      expect(sft.includes("--threads")).toBe(config.threads !== null);
    });
  }
  it("lora_rank=8 algorithm=ppo: PPO on the actor's adapters at 10x the learning rate, a full critic", () => {
    const config = resolveConfig(quickstartSpec, { overrides: ["lora_rank=8", "algorithm=ppo"] });
    expect(resolveLine(quickstartSteps(config).train(url))).toMatchObject({
      model: { lora_rank: 8 },
      algorithm: { name: "ppo" },
      actor: { lr: 0.003 },
      trainer: { experiment_name: "ppo-lora8" },
    });
  });
});
