/**
 * The device bytes of a model's buffers as the native code allocates them: `searchr1-trainer
 * plan` (native/src/cli/trainer/plan.cpp) counts them with the allocating code itself (the
 * activations' and the engine step's layouts, the learner's shards and buckets, the KV
 * budget), from the model folder's config.json alone. The memory plan
 * (src/planning/memory-plan.ts) adds these up moment by moment; it restates none of them.
 */
import { spawnSync } from "node:child_process";
import { InputError } from "../runtime/errors.js";
import { nativeExecutable } from "../runtime/native-executable.js";

export type Device = "cuda" | "cpu";

/** What a learner keeps in host memory (its param_offload, grad_offload, optimizer_offload). */
export interface Offload {
  param: boolean;
  grad: boolean;
  optimizer: boolean;
}
export const NO_OFFLOAD: Offload = { param: false, grad: false, optimizer: false };

/** A trained model's bytes on one rank at one ZeRO stage (Learner::Memory, learner.h). */
export interface LearnerBytes {
  /** The compute copy, while on the device (with param offload: during its commands). */
  weights: number;
  masters: number;
  optimizer: number;
  /** During an update, and between updates. */
  gradients: number;
  gradientsBetween: number;
  /** Host memory (the offloads). */
  hostWeights: number;
  hostMasters: number;
  hostOptimizer: number;
  hostGradients: number;
}

/** The activations of passes over `tokens` rows, and the CUDA attention's scratch. */
export interface PassBytes {
  tokens: number;
  forward: number;
  backward: number;
  backwardRecompute: number;
  attentionForwardScratch: number;
  attentionBackwardScratch: number;
}

/** The engine `train` starts on the device (searchr1-engine's defaults). */
export interface EngineBytes {
  weights: number;
  workspace: number;
  /** The buffers of its largest step: chunkTokens prompt tokens beside maxRunning decode rows. */
  step: number;
  chunkTokens: number;
  maxRunning: number;
  contextLength: number;
  blockSize: number;
  kvBlock: number;
  /** Blocks its budget gives the KV cache; 0 when it would refuse to start (`refused`). */
  kvBlocks: number;
  refused: string | null;
}

export interface ModelBytes {
  parameters: number;
  /** The flat buffer's floats, alignment gaps included, before ZeRO's padding. */
  floats: number;
  /** At ZeRO stage 0, 1 and 2. */
  learner: [LearnerBytes, LearnerBytes, LearnerBytes];
  /** An untrained copy's (the reference's). */
  computeCopy: number;
  passes: PassBytes[];
  /** cuBLASLt's, one per CUDA process (0 on the CPU). */
  workspace: number;
  engine: EngineBytes | null;
  /**
   * With LoRA: the adapters' floats, their learner at ZeRO stage 0, 1 and 2, and each pass's
   * adapter scratch (in the order of `passes`: loraScratchOf).
   */
  lora: {
    floats: number;
    learner: [LearnerBytes, LearnerBytes, LearnerBytes];
    scratch: number[];
  } | null;
}

export interface SizesRequest {
  /** A folder with the model's config.json. */
  dir: string;
  head: "lm" | "value";
  device: Device;
  ranks: number;
  offload: Offload;
  /** Token rows of the passes to size. */
  tokens: number[];
  /** Plan the engine too, on a device of this many GiB, at this share of it. */
  engine?: { deviceGiB: number; utilization: number };
  /** LoRA adapters on the model (load's `lora`). */
  lora?: { rank: number; targets: "all-linear" | string[] };
}

/** `searchr1-trainer plan` for `req`. */
export function modelBytes(req: SizesRequest): ModelBytes {
  const offload = (Object.keys(req.offload) as (keyof Offload)[]).filter((k) => req.offload[k]);
  const args = [
    "plan",
    "--model",
    req.dir,
    "--head",
    req.head,
    "--device",
    req.device,
    "--ranks",
    String(req.ranks),
    "--tokens",
    [...new Set(req.tokens.filter((t) => t > 0))].join(","),
  ];
  if (offload.length > 0) args.push("--offload", offload.join(","));
  if (req.lora) {
    const { rank, targets } = req.lora;
    args.push("--lora-rank", String(rank), "--lora-targets", [targets].flat().join(","));
  }
  if (req.engine) {
    args.push("--device-memory-gib", String(req.engine.deviceGiB));
    args.push("--gpu-memory-utilization", String(req.engine.utilization));
  }
  const r = spawnSync(nativeExecutable("searchr1-trainer"), args, { encoding: "utf8" });
  if (r.status !== 0) {
    const why = (r.stderr || r.error?.message || `exit ${r.status}`).trim();
    throw new InputError(
      `the memory plan of ${req.dir}: ${why.replace(/^searchr1-trainer: /, "")}`,
    );
  }
  return parse(JSON.parse(r.stdout) as PlanJson);
}

/** The pass of `tokens` rows among those `modelBytes` sized. */
export function passOf(bytes: ModelBytes, tokens: number): PassBytes {
  const pass = bytes.passes.find((p) => p.tokens === tokens);
  if (!pass) throw new Error(`no pass of ${tokens} tokens was sized (a bug)`);
  return pass;
}

/** With LoRA: the adapters' scratch of the pass of `tokens` rows among those sized. */
export function loraScratchOf(bytes: ModelBytes, tokens: number): number {
  const scratch = bytes.lora?.scratch[bytes.passes.findIndex((p) => p.tokens === tokens)];
  if (scratch === undefined)
    throw new Error(`no LoRA scratch of ${tokens} tokens was sized (a bug)`);
  return scratch;
}

type Json = Record<string, number>;
interface PlanJson {
  parameters: number;
  floats: number;
  learner: Json[];
  compute_copy: number;
  passes: Json[];
  workspace: number;
  engine?: Record<string, number | string | null>;
  lora?: { floats: number; learner: Json[]; scratch: number[] };
}

function parse(j: PlanJson): ModelBytes {
  const learnerOf = (m: Json): LearnerBytes => ({
    weights: m.weights as number,
    masters: m.master_weights as number,
    optimizer: m.optimizer_state as number,
    gradients: m.gradients as number,
    gradientsBetween: m.gradients_between_updates as number,
    hostWeights: m.host_weights as number,
    hostMasters: m.host_master_weights as number,
    hostOptimizer: m.host_optimizer_state as number,
    hostGradients: m.host_gradients as number,
  });
  const learner = j.learner.map(learnerOf);
  const e = j.engine;
  return {
    parameters: j.parameters,
    floats: j.floats,
    learner: learner as ModelBytes["learner"],
    computeCopy: j.compute_copy,
    passes: j.passes.map((p) => ({
      tokens: p.tokens as number,
      forward: p.forward as number,
      backward: p.backward as number,
      backwardRecompute: p.backward_recompute as number,
      attentionForwardScratch: p.attention_forward_scratch as number,
      attentionBackwardScratch: p.attention_backward_scratch as number,
    })),
    workspace: j.workspace,
    engine: e
      ? {
          weights: e.weights as number,
          workspace: e.workspace as number,
          step: e.step as number,
          chunkTokens: e.chunk_tokens as number,
          maxRunning: e.max_running as number,
          contextLength: e.context_length as number,
          blockSize: e.block_size as number,
          kvBlock: e.kv_block as number,
          kvBlocks: e.kv_blocks as number,
          refused: (e.refused as string | null) ?? null,
        }
      : null,
    lora: j.lora
      ? {
          floats: j.lora.floats,
          learner: j.lora.learner.map(learnerOf) as [LearnerBytes, LearnerBytes, LearnerBytes],
          scratch: j.lora.scratch,
        }
      : null,
  };
}
