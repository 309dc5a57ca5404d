// The small `train` run the end-to-end tests share (train.test.ts, nodes.test.ts): 12
// questions (nq 8, hotpotqa 4; 2 + 2 to validate), a BM25 index of 200 rows started as the
// run's retriever, the tiny test model, 4 prompts × 2 a step for 3 steps, CPU everywhere:
// small enough for two shared cores.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { modelDir } from "../engine/helpers.js";
import { preprocessQa, type QaRow } from "../helpers/qa-data.js";
import { buildTestIndex } from "../retrieval/helpers.js";

export const MODEL = modelDir("qwen-bpe");

const rows = (split: string, n: number): QaRow[] =>
  Array.from({ length: n }, (_, i) => ({
    id: `${split}_${i}`,
    question: `who is paul walker number ${i}`,
    golden_answers: ["an actor"],
  }));

export interface SmallRun {
  /** A fresh folder for the runs' outputs; removed by cleanup(). */
  dir: string;
  /** `searchr1 train` arguments writing under `out`, then `extra`. */
  args(out: string, extra?: string[]): string[];
  cleanup(): void;
}

/** The data and the index, written once for a test file. */
export function smallRun(prefix: string): SmallRun {
  const dir = mkdtempSync(path.join(os.tmpdir(), prefix));
  const data = preprocessQa(dir, {
    nq: { train: rows("train", 8), test: rows("test", 2) },
    hotpotqa: { train: rows("train", 4), test: rows("test", 2) },
  });
  const ix = buildTestIndex({ rows: 200 });
  return {
    dir,
    args: (out, extra = []) => [
      "train",
      "--model",
      MODEL,
      "--output-dir",
      out,
      `data.train_files=${data.train}`,
      `data.val_files=${data.test}`,
      `retriever.index=${ix.index}`,
      `retriever.corpus=${ix.corpus}`,
      "data.train_batch_size=4",
      "rollout.n=2",
      "actor.ppo_mini_batch_size=2",
      "data.max_prompt_length=400",
      "data.max_response_length=8",
      "data.max_obs_length=24",
      "rollout.max_turns=1",
      "actor.lr=1e-3",
      "actor.lr_warmup_steps_ratio=0",
      "trainer.total_training_steps=3",
      "trainer.save_freq=1",
      "trainer.test_freq=2",
      "rollout.engine_device=cpu",
      "rollout.engine_threads=1",
      "trainer.device=cpu",
      "trainer.threads=1",
      ...extra,
    ],
    cleanup: () => {
      ix.cleanup();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export const runDir = (out: string) => path.join(out, "searchr1", "nq_hotpotqa-grpo");

export const metrics = (out: string) =>
  readFileSync(path.join(runDir(out), "metrics.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l)
    .map((l) => JSON.parse(l) as Record<string, number>);

/**
 * What must be equal between two runs of the same steps: everything but the timings, and the
 * engine-vs-trainer log-prob gap and mismatch metrics (the engine's log-probs round
 * differently with the batch it happens to run in; the sampled tokens do not change, so
 * everything downstream is equal).
 */
export const deterministic = (row: Record<string, number>) =>
  Object.fromEntries(
    Object.entries(row).filter(
      ([k]) =>
        !k.startsWith("timing/") &&
        !k.startsWith("throughput/") &&
        !k.startsWith("rollout_corr/") &&
        k !== "rollout/logprob_gap",
    ),
  );
