/**
 * The memory plan of a `train` run: the bytes one device holds, its trainer rank and its
 * native engine replica, computed from the model's dimensions and the run's config as the
 * native code allocates them (not measured, and not a rule of thumb). `searchr1 train
 * --dry-run` prints it (src/planning/dry-run.ts). What it follows:
 * - native/src/model/params.h: one flat fp32 parameter buffer, each weight group starting at
 *   a multiple of 128 floats; train/learner.h: ZeRO pads it to a multiple of ranks × 128 and
 *   gives each rank one equal shard of the masters, the AdamW moments and (stage 2) the
 *   gradients, which the backward hands over region by region (the embeddings, a layer, the
 *   head: two buckets); the compute copy (bf16 on CUDA, the fp32 masters themselves on the
 *   CPU) stays whole on every rank, as does the fp32 gradient buffer during an update below
 *   stage 2.
 * - train/learner.h, its offloads (actor.* and critic.*_offload, verl's fsdp_config ones): what
 *   a learner keeps in host memory instead, shown apart and in no device total; with param
 *   offload its compute copy is on the device during its log-probs and updates only.
 * - train/session.cpp: the reference keeps its compute copy alone.
 * - model/qwen2.cpp reserve(): the activations of one pass over N tokens (a forward-only pass
 *   holds two layer inputs, a backward pass every layer's); train/session.cpp frees a model's
 *   when the command that ran it ends, so a phase holds its own command's alone.
 * - backend/cuda: the 32 MiB cuBLASLt workspace, the attention's scratch.
 * - cli/engine/main.cpp: the engine's compute copy, the buffers of its largest step, and its
 *   KV cache filling rollout.gpu_memory_utilization × the device's memory (vLLM's meaning)
 *   after them; with rollout.free_cache_engine the KV cache's memory and the step's buffers
 *   go back to the device while the trainer works (src/train/step.ts: after the rollouts,
 *   until the new weights are in).
 * Three moments of a step are summed: the rollout (the engine's weights and KV cache, and all
 * the trainer keeps between commands: no activations), the log-probs and the updates (the
 * gradients too, the engine's KV cache unless it was released, and the activations of the
 * largest command of the phase, as the trainer runs one at a time). The peak is the largest.
 */
import type { ModelDims } from "../ckpt/model-dims.js";
import type { TrainConfig } from "../config/schemas/train.js";
import {
  batchSizes,
  type PassBatching,
  passSize,
  type UpdateBatching,
  updateTokens,
} from "../trainer/batch-sizes.js";

/** ParamLayout::kAlign: each weight group starts at a multiple of it (floats). */
export const PARAM_ALIGN = 128;
/** kCpuLogitsChunk / kGpuLogitsChunk (model/qwen2.h): the trainer's predicted rows per head chunk. */
export const LOGITS_CHUNK: Record<Device, number> = { cpu: 256, cuda: 2048 };
/** cuda::Matmul::kWorkspaceBytes: each CUDA process's cuBLASLt workspace. */
export const CUDA_WORKSPACE = 32 * 2 ** 20;
export const GiB = 2 ** 30;
/** The native engine's KV block: positions per block (cli/engine/main.cpp kBlockSize). */
export const KV_BLOCK = 16;
/**
 * searchr1-engine's defaults on a GPU, which the engine started by `train` keeps
 * (engine/engine.h EngineOptions): prompt tokens prefilled per step, sequences per step, rows
 * of a logits chunk.
 */
export const ENGINE_CHUNK_TOKENS = 8192;
export const ENGINE_MAX_RUNNING = 256;
export const ENGINE_LOGITS_CHUNK = 64;

export type ZeroStage = 0 | 1 | 2;
export type Device = "cuda" | "cpu";

/** A model as the plan needs it: config.json's sizes and whether q/k/v have biases. */
export interface PlanModel {
  dims: ModelDims;
  /** Qwen2 always has q/k/v biases; Llama as its config.json says. */
  attentionBias: boolean;
}

/** trainer.zero_stage, null resolved: 0 on one rank, 2 on several. */
export function zeroStageOf(config: TrainConfig): ZeroStage {
  const ranks = config.trainer.gpus * config.trainer.nnodes;
  return (config.trainer.zero_stage ?? (ranks > 1 ? 2 : 0)) as ZeroStage;
}

/** The flat buffer of a model (ParamLayout): its floats, alignment gaps included, and its parameters. */
export function paramLayout(m: PlanModel, head: "lm" | "value"): ParamLayout {
  const {
    hiddenSize: H,
    intermediateSize: I,
    vocabSize: V,
    layers,
    heads,
    kvHeads,
    headDim,
  } = m.dims;
  const Q = heads * headDim;
  const KV = kvHeads * headDim;
  let floats = 0;
  let parameters = 0;
  const add = (numel: number, aligned = true) => {
    if (aligned) floats = Math.ceil(floats / PARAM_ALIGN) * PARAM_ALIGN;
    floats += numel;
    parameters += numel;
  };
  add(V * H);
  const layerStarts: number[] = [];
  for (let l = 0; l < layers; l++) {
    add(H);
    layerStarts.push(floats - H);
    add(Q * H);
    add(KV * H, false);
    add(KV * H, false);
    if (m.attentionBias) {
      add(Q);
      add(KV, false);
      add(KV, false);
    }
    add(H * Q);
    add(H);
    add(I * H);
    add(I * H, false);
    add(H * I);
  }
  add(H);
  const norm = floats - H;
  if (head === "value") {
    add(H);
    add(1, false);
  } else if (!m.dims.tied) {
    add(V * H);
  }
  const ends = [...layerStarts.slice(1), norm];
  return {
    floats,
    parameters,
    embedRegion: layerStarts[0] ?? norm,
    widestLayer: Math.max(0, ...layerStarts.map((start, l) => (ends[l] as number) - start)),
    norm,
  };
}

/**
 * The flat buffer of a model (native/src/model/params.h) and the regions a backward pass
 * hands a ZeRO stage 2 learner (Qwen2Model::GradientSink): the embeddings [0, embedRegion),
 * each layer (the widest is widestLayer floats), and the final norm and head [norm, the
 * padded end).
 */
export interface ParamLayout {
  /** Floats with the alignment gaps, before ZeRO's padding. */
  floats: number;
  parameters: number;
  embedRegion: number;
  widestLayer: number;
  norm: number;
}

/** What one pass allocates: forward only (log-probs, values) or forward and backward. */
export interface PassShape {
  /** Token rows of the pass (the packed micro-batch's real tokens). */
  tokens: number;
  backward: boolean;
  /** gradient_checkpointing: one layer's buffers, recomputed, instead of every layer's. */
  recompute: boolean;
}

/** Bytes of Qwen2Model's activations for one pass on `device` (qwen2.cpp reserve()). */
export function activationBytes(d: ModelDims, pass: PassShape, device: Device): number {
  const N = pass.tokens;
  const x = device === "cuda" ? 2 : 4;
  const { hiddenSize: H, intermediateSize: I, vocabSize: V, layers: L, heads: NH } = d;
  const Q = NH * d.headDim;
  const QKV = (NH + 2 * d.kvHeads) * d.headDim;
  const C = Math.max(1, Math.min(LOGITS_CHUNK[device], N)); // Qwen2Model::logits_rows
  const sets = pass.backward && !pass.recompute ? L : 1;
  // A backward pass reads every layer's input again; a forward-only one uses two in turn.
  const inputs = pass.backward ? L + 1 : 2;
  // Compute-type buffers: the layers' inputs, the layer sets, the final norm, the head's
  // chunk and logits, the values row.
  let xs = inputs * N * H + sets * N * (3 * H + QKV + Q + 3 * I) + N * H + C * H + C * V + N;
  let fs = sets * N * (2 + NH) + 3 * N; // rstd1, lse, rstd2 per set; rstdf, logprob, entropy
  const ints = 5 * N; // ids, mask, positions, head rows, targets
  if (pass.backward) {
    xs += N * (3 * H + QKV + Q + 3 * I) + C * H; // dres, dln, dlnf, dqkv, datt, dgu, dact; dhead_in
    fs += 2 * N; // coef, ent_coef
  }
  return xs * x + fs * 4 + ints * 4;
}

/**
 * Bytes of the engine's buffers for its largest step (model/paged.h PagedBuffers): a prefill
 * chunk beside a decode row for every running sequence, and `tableEntries` block-table
 * entries (the plan leaves them out: at most 2 MiB, at a context of 32,768).
 */
export function engineStepBytes(
  d: ModelDims,
  x: number,
  engine = { chunkTokens: ENGINE_CHUNK_TOKENS, maxRunning: ENGINE_MAX_RUNNING, tableEntries: 0 },
): number {
  const R = engine.chunkTokens + engine.maxRunning;
  const { hiddenSize: H, intermediateSize: I, vocabSize: V, heads: NH } = d;
  const Q = NH * d.headDim;
  const QKV = (NH + 2 * d.kvHeads) * d.headDim;
  const C = ENGINE_LOGITS_CHUNK;
  const xs = R * (3 * H + QKV + Q + 3 * I) + C * H + C * V; // x, ln, h, qkv, att, gu, act; head
  return xs * x + R * 4 + (5 * R + engine.tableEntries) * 4; // rstd; the step's integers
}

/** The CUDA attention's scratch for one pass (attention.cu): spans, and the backward's fp32 dq. */
export function attentionScratchBytes(d: ModelDims, pass: PassShape): number {
  const N = pass.tokens;
  const spans = 8 * N;
  return pass.backward ? spans + 4 * N * (d.heads * d.headDim + d.heads) : spans;
}

/** A trained model's bytes on one rank (Learner::Memory), at one ZeRO stage. */
export interface LearnerBytes {
  /** Device memory. */
  weights: number;
  masters: number;
  optimizer: number;
  gradients: number;
  gradientsBetween: number;
  /** Host memory (the offloads). */
  hostWeights: number;
  hostMasters: number;
  hostOptimizer: number;
  hostGradients: number;
}

/** What a learner keeps in host memory (its param_offload, grad_offload, optimizer_offload). */
export interface Offload {
  param: boolean;
  grad: boolean;
  optimizer: boolean;
}
export const NO_OFFLOAD: Offload = { param: false, grad: false, optimizer: false };

/** A learner's offload keys as the plan takes them. */
export function offloadOf(l: {
  param_offload: boolean;
  grad_offload: boolean;
  optimizer_offload: boolean;
}): Offload {
  return { param: l.param_offload, grad: l.grad_offload, optimizer: l.optimizer_offload };
}

/** The flat buffer's floats as ZeRO pads them (a multiple of ranks × 128 from stage 1 on). */
export function paddedFloats(floats: number, ranks: number, stage: ZeroStage): number {
  const multiple = stage > 0 ? ranks * PARAM_ALIGN : 1;
  return Math.ceil(floats / multiple) * multiple;
}

/**
 * Learner::Memory for a model over `ranks` ranks at `stage`. At stage 2 over several ranks
 * the gradients are the rank's shard and the backward's buckets: the embeddings' region and
 * the widest of the others (a layer, or the final norm and head up to the padded end).
 * `weights` is the compute copy while on the device (param offload: during its commands).
 * The offloads move the masters and moments (optimizer), the gradient shard at stage 2 and
 * the whole buffer between updates below it (grad), to host memory; the host step reads a
 * host copy of the gradient (grad or optimizer). On the CPU the learner's host masters are a
 * copy apart from the fp32 compute copy.
 */
export function learnerBytes(
  layout: ParamLayout,
  ranks: number,
  stage: ZeroStage,
  device: Device,
  offload: Offload = NO_OFFLOAD,
): LearnerBytes {
  const { floats } = layout;
  const capacity = paddedFloats(floats, ranks, stage);
  const shard = stage > 0 ? capacity / ranks : floats;
  const x = device === "cuda" ? 2 : 4;
  const buckets = layout.embedRegion + Math.max(layout.widestLayer, capacity - layout.norm);
  const bucketed = stage === 2 && ranks > 1;
  return {
    weights: x * capacity,
    // On the CPU the compute copy is fp32 and is the masters.
    masters: device === "cuda" && !offload.optimizer ? 4 * shard : 0,
    optimizer: offload.optimizer ? 0 : 8 * shard,
    gradients: bucketed ? 4 * ((offload.grad ? 0 : shard) + buckets) : 4 * capacity,
    gradientsBetween: stage === 2 || offload.grad ? 0 : 4 * capacity,
    hostWeights: offload.param ? x * capacity : 0,
    hostMasters: offload.optimizer ? 4 * shard : 0,
    hostOptimizer: offload.optimizer ? 8 * shard : 0,
    hostGradients: offload.grad || offload.optimizer ? 4 * shard : 0,
  };
}

/** Everything the plan takes; planInput() derives it from a train config. */
export interface PlanInput {
  policy: PlanModel;
  /** The critic's model (critic.model_path), null without a critic (GRPO and the others). */
  critic: PlanModel | null;
  reference: boolean;
  /** ref.param_offload: the reference waits in host memory between its log-probs. */
  referenceOffload?: boolean;
  /** actor.*_offload and critic.*_offload: what each learner keeps in host memory. */
  actorOffload?: Offload;
  criticOffload?: Offload;
  /** Data-parallel ranks over every node (trainer.gpus × trainer.nnodes). */
  ranks: number;
  /** The stage the run uses; the plan shows all three. */
  stage: ZeroStage;
  device: Device;
  recompute: boolean;
  /** Token rows of one pass, per rank. */
  tokens: { update: number; logProbs: number; criticUpdate: number; values: number };
  /**
   * The native engine replica on this device, or null when it is elsewhere; `release`: it
   * gives its KV cache back while the trainer works (rollout.free_cache_engine).
   */
  engine: { utilization: number; release: boolean } | null;
  /** Why there is no engine row (when engine is null). */
  engineElsewhere?: string;
  deviceBytes: number;
  /** The bound on a trajectory's tokens the token counts assume. */
  trajectoryTokens: number;
}

/**
 * The longest trajectory the rollout can produce: its prompt (data.max_start_length), then
 * rollout.max_turns turns of a response and an observation, and a last response.
 */
export function trajectoryBound(config: TrainConfig): number {
  const { max_start_length, max_response_length, max_obs_length } = config.data;
  return (
    max_start_length +
    config.rollout.max_turns * (max_response_length + max_obs_length) +
    max_response_length
  );
}

/** The plan's input for a run of `config` whose models are `policy` (and `critic`). */
export function planInput(config: TrainConfig, policy: PlanModel, critic: PlanModel): PlanInput {
  const { trainer, rollout, actor, algorithm } = config;
  const ranks = trainer.gpus * trainer.nnodes;
  const T = trajectoryBound(config);
  const b = batchSizes(config, ranks);
  const perRank = (rows: number) => Math.ceil(rows / ranks);
  // A micro-batch holds at most its budget of the rank's rows (step.ts: a count of the
  // longest trajectories, or use_dynamic_bsz's tokens, never less than one trajectory).
  const tokensOf = (budget: number, rows: number) => Math.max(T, Math.min(budget, rows * T));
  const updateTokensOf = (u: UpdateBatching) => tokensOf(updateTokens(u, T), perRank(u.miniBatch));
  const passTokensOf = (p: PassBatching) => tokensOf(passSize(p, T) * T, perRank(b.trajectories));
  const ppo = algorithm.name === "ppo";
  const native = rollout.engine === "native" && rollout.engine_url === null;
  const engineOnDevice = native && rollout.engine_device !== "cpu" && trainer.device !== "cpu";
  return {
    policy,
    critic: ppo ? critic : null,
    reference: actor.use_kl_loss || algorithm.use_kl_in_reward,
    referenceOffload: config.ref.param_offload,
    actorOffload: offloadOf(config.actor),
    criticOffload: offloadOf(config.critic),
    ranks,
    stage: zeroStageOf(config),
    device: trainer.device === "cpu" ? "cpu" : "cuda",
    recompute: actor.gradient_checkpointing,
    tokens: {
      update: updateTokensOf(b.actor),
      logProbs: Math.max(passTokensOf(b.policyLogProbs), passTokensOf(b.refLogProbs)),
      criticUpdate: b.critic ? updateTokensOf(b.critic) : 0,
      values: b.values ? passTokensOf(b.values) : 0,
    },
    engine: engineOnDevice
      ? { utilization: rollout.gpu_memory_utilization, release: rollout.free_cache_engine }
      : null,
    engineElsewhere: engineOnDevice
      ? undefined
      : !native
        ? `the engine runs elsewhere (${rollout.engine_url ?? `rollout.engine=${rollout.engine}`})`
        : "the engine runs on the CPU",
    deviceBytes: trainer.device_memory_gib * GiB,
    trajectoryTokens: T,
  };
}

type Triple = [number, number, number];

/**
 * One line of the plan: the bytes at ZeRO stage 0, 1, 2 held during the rollouts, during the
 * log-probs (old, reference, values) and during the updates; `counted` false: shown for
 * comparison, in no total; `host`: held in host memory (an offload), in no device total;
 * `perCommand`: held by one trainer command alone (its activations), so a moment's total
 * counts the largest such row, not their sum.
 */
export interface PlanRow {
  part: "actor" | "reference" | "critic" | "engine" | "trainer";
  item: string;
  rollout: Triple;
  logProbs: Triple;
  update: Triple;
  counted: boolean;
  host?: boolean;
  perCommand?: boolean;
}

export interface MemoryPlan {
  input: PlanInput;
  parameters: number;
  rows: PlanRow[];
  /**
   * The counted rows' sums at each stage, at each moment of a step, and the largest; `host`:
   * the most the host rows hold at once (the offloads), apart from them.
   */
  totals: { rollout: Triple; logProbs: Triple; update: Triple; peak: Triple; host: Triple };
  /** The engine's KV cache is out of room (its weights alone exceed its share). */
  engineRefuses: boolean;
}

const STAGES: ZeroStage[] = [0, 1, 2];
type Moment = "rollout" | "logProbs" | "update";
const MOMENTS: [Moment, string][] = [
  ["rollout", "during the rollouts"],
  ["logProbs", "during the log-probs"],
  ["update", "during the updates"],
];
const same = (b: number): Triple => [b, b, b];
const byStage = (f: (s: ZeroStage) => number): Triple => STAGES.map(f) as Triple;

/** The plan: pure arithmetic over `input`. */
export function memoryPlan(input: PlanInput): MemoryPlan {
  const { device, ranks, recompute, tokens } = input;
  const x = device === "cuda" ? 2 : 4;
  const xName = device === "cuda" ? "bf16" : "fp32";
  const d = input.policy.dims;
  const policy = paramLayout(input.policy, "lm");
  const rows: PlanRow[] = [];
  // Held throughout (`update` omitted), or `rollout` during the rollouts, `update` during the
  // updates and `logProbs` (default: `update`) during the log-probs.
  const row = (
    part: PlanRow["part"],
    item: string,
    rollout: Triple,
    update: Triple = rollout,
    counted = true,
    logProbs: Triple = update,
  ) => rows.push({ part, item, rollout, logProbs, update, counted });
  // A line of host memory (an offload): shown after the device's, in no device total.
  const hostRows: PlanRow[] = [];
  const hostRow = (part: PlanRow["part"], item: string, bytes: Triple) => {
    if (bytes.some((b) => b > 0)) {
      hostRows.push({
        part,
        item,
        rollout: bytes,
        logProbs: bytes,
        update: bytes,
        counted: false,
        host: true,
      });
    }
  };
  const learnerRows = (part: "actor" | "critic", layout: ParamLayout, offload: Offload) => {
    const at = STAGES.map((s) => learnerBytes(layout, ranks, s, device, offload));
    const pick = (k: keyof LearnerBytes) => at.map((b) => b[k]) as Triple;
    if (offload.param) {
      row(
        part,
        `weights (${xName} compute copy), on the device for its log-probs and updates only`,
        same(0),
        pick("weights"),
      );
    } else {
      row(part, `weights (${xName} compute copy)`, pick("weights"));
    }
    if (device === "cuda" && !offload.optimizer) row(part, "fp32 master weights", pick("masters"));
    if (!offload.optimizer) row(part, "AdamW moments (fp32 m, v)", pick("optimizer"));
    row(
      part,
      offload.grad
        ? "fp32 gradients (during the backward only: stage 2 its buckets, below it the whole)"
        : "fp32 gradients (stage 2: a shard, and buckets during the backward; in updates only)",
      pick("gradientsBetween"),
      pick("gradients"),
      true,
      pick("gradientsBetween"),
    );
    hostRow(
      part,
      `weights (${xName} compute copy) between its log-probs and updates`,
      pick("hostWeights"),
    );
    hostRow(part, "fp32 master weights", pick("hostMasters"));
    hostRow(part, "AdamW moments (fp32 m, v)", pick("hostOptimizer"));
    hostRow(part, "fp32 gradients the step reads", pick("hostGradients"));
  };
  const tok = (n: number) => `${n.toLocaleString("en-US")} tokens`;
  // The activations of one command's passes, during its phase only (`moment`): session.cpp
  // frees them when the command ends.
  const commandRow = (
    part: PlanRow["part"],
    item: string,
    moment: "logProbs" | "update",
    bytes: number,
    counted = true,
  ) =>
    rows.push({
      part,
      item,
      rollout: same(0),
      logProbs: same(moment === "logProbs" ? bytes : 0),
      update: same(moment === "update" ? bytes : 0),
      counted,
      perCommand: true,
    });
  const actsRows = (
    part: "actor" | "critic",
    m: PlanModel,
    train: number,
    forward: number,
    forwardName: string,
    forwardPhase: string,
  ) => {
    const on = activationBytes(m.dims, { tokens: train, backward: true, recompute: true }, device);
    const off = activationBytes(
      m.dims,
      { tokens: train, backward: true, recompute: false },
      device,
    );
    const fwd = activationBytes(m.dims, { tokens: forward, backward: false, recompute }, device);
    const checkpointing = (yes: boolean) => `gradient checkpointing ${yes ? "on" : "off"}`;
    commandRow(
      part,
      `activations, update micro-batch (${tok(train)}), ${checkpointing(recompute)}, during its updates only`,
      "update",
      recompute ? on : off,
    );
    commandRow(
      part,
      `activations, the same, ${checkpointing(!recompute)}`,
      "update",
      recompute ? off : on,
      false,
    );
    commandRow(
      part,
      `activations, ${forwardName} (${tok(forward)}, forward), during its ${forwardPhase} only`,
      "logProbs",
      fwd,
    );
  };

  const actorOffload = input.actorOffload ?? NO_OFFLOAD;
  learnerRows("actor", policy, actorOffload);
  actsRows(
    "actor",
    input.policy,
    tokens.update,
    tokens.logProbs,
    "log-prob micro-batch",
    "log-probs",
  );
  if (input.reference) {
    // ref.param_offload: in host memory but for its log-probs.
    const weights = x * policy.floats;
    if (input.referenceOffload) {
      row(
        "reference",
        `weights (${xName} compute copy), on the device for its log-probs only`,
        same(0),
        same(0),
        true,
        same(weights),
      );
    } else {
      row("reference", `weights (${xName} compute copy)`, same(weights));
    }
    commandRow(
      "reference",
      `activations, log-prob micro-batch (${tok(tokens.logProbs)}, forward), during its log-probs only`,
      "logProbs",
      activationBytes(d, { tokens: tokens.logProbs, backward: false, recompute }, device),
    );
  }
  if (input.critic) {
    const criticOffload = input.criticOffload ?? NO_OFFLOAD;
    learnerRows("critic", paramLayout(input.critic, "value"), criticOffload);
    actsRows(
      "critic",
      input.critic,
      tokens.criticUpdate,
      tokens.values,
      "values micro-batch",
      "values pass",
    );
  }
  if (device === "cuda") {
    const passes: [PlanModel, PassShape][] = [
      [input.policy, { tokens: tokens.update, backward: true, recompute }],
      [input.policy, { tokens: tokens.logProbs, backward: false, recompute }],
    ];
    if (input.critic) {
      passes.push([input.critic, { tokens: tokens.criticUpdate, backward: true, recompute }]);
    }
    const scratch = Math.max(...passes.map(([m, p]) => attentionScratchBytes(m.dims, p)));
    row("trainer", "cuBLASLt workspace and attention scratch", same(CUDA_WORKSPACE + scratch));
  }

  let engineRefuses = false;
  if (input.engine) {
    const weights = x * policy.floats;
    row("engine", `weights (${xName} compute copy)`, same(weights));
    const budget = input.engine.utilization * input.deviceBytes;
    const step = engineStepBytes(d, x);
    const kv = Math.max(0, budget - weights - CUDA_WORKSPACE - step);
    // PagedKvCache::bytes_per_block: keys and values of 16 positions, every layer.
    const block = 2 * d.layers * d.kvHeads * KV_BLOCK * d.headDim * x;
    engineRefuses = kv < block;
    const positions = Math.floor(kv / block) * KV_BLOCK;
    const release = input.engine.release;
    row(
      "engine",
      `KV cache: ${input.engine.utilization} × device − weights, ` +
        `${positions.toLocaleString("en-US")} token positions` +
        (release ? " (released while the trainer works)" : ""),
      same(kv),
      same(release ? 0 : kv),
    );
    row(
      "engine",
      `buffers of its largest step (${ENGINE_CHUNK_TOKENS} prompt tokens and ` +
        `${ENGINE_MAX_RUNNING} sequences)` +
        (release ? ", given back with the KV cache" : ""),
      same(step),
      same(release ? 0 : step),
    );
    row("engine", "cuBLASLt workspace", same(CUDA_WORKSPACE));
  }
  rows.push(...hostRows);
  // What is held throughout a moment, and the largest command's activations.
  const sum = (moment: Moment) =>
    byStage((s) => {
      const counted = rows.filter((r) => r.counted);
      const held = counted.reduce((t, r) => t + (r.perCommand ? 0 : r[moment][s]), 0);
      return held + Math.max(0, ...counted.map((r) => (r.perCommand ? r[moment][s] : 0)));
    });
  const rollout = sum("rollout");
  const logProbs = sum("logProbs");
  const update = sum("update");
  const peak = byStage((s) => Math.max(rollout[s], logProbs[s], update[s]));
  const host = byStage((s) => rows.reduce((t, r) => t + (r.host ? r.update[s] : 0), 0));
  return {
    input,
    parameters: policy.parameters,
    rows,
    totals: { rollout, logProbs, update, peak, host },
    engineRefuses,
  };
}

const gib = (b: number) => (b / GiB).toFixed(2);

/** Whether the plan's peak fits the device at `stage`, and by how much. */
export function fitsAt(plan: MemoryPlan, stage: ZeroStage): { fits: boolean; margin: number } {
  const margin = plan.input.deviceBytes - plan.totals.peak[stage];
  return { fits: margin >= 0 && !plan.engineRefuses, margin };
}

/**
 * The plan as `train --dry-run` prints it: one row per part, a column per ZeRO stage, GiB;
 * a row's number is the most it holds (the notes in its name say when).
 */
export function formatPlan(plan: MemoryPlan, title: string): string {
  const { input, totals } = plan;
  const header = STAGES.map((s) => `stage ${s}${s === input.stage ? "*" : ""}`);
  const names = plan.rows.map(
    (r) =>
      `${r.part.padEnd(9)} ${r.item}${r.host ? " (host memory)" : r.counted ? "" : " (not in the totals)"}`,
  );
  const width = Math.max(...names.map((n) => n.length));
  const cell = (s: string) => s.padStart(9);
  const line = (name: string, cells: string[]) =>
    `${name.padEnd(width)}  ${cells.map(cell).join(" ")}`;
  const most = (r: PlanRow) => byStage((s) => Math.max(r.rollout[s], r.logProbs[s], r.update[s]));
  const lines = [
    title,
    line("GiB per device", header),
    ...plan.rows.map((r, i) => line(names[i] ?? "", most(r).map(gib))),
    ...MOMENTS.map(([m, when]) => line(`total ${when}`, totals[m].map(gib))),
  ];
  if (plan.rows.some((r) => r.host)) {
    lines.push(line("total in host memory (offloads, apart from the above)", totals.host.map(gib)));
  }
  const { fits, margin } = fitsAt(plan, input.stage);
  const device = `${gib(input.deviceBytes)} GiB`;
  const s = input.stage;
  // The moment of the peak (the last of equals: the updates before the log-probs).
  const when = MOMENTS.reduce((best, m) => (totals[m[0]][s] >= totals[best[0]][s] ? m : best))[1];
  lines.push(
    plan.engineRefuses
      ? `does NOT fit: the engine's share (rollout.gpu_memory_utilization × ${device}) leaves no room for a KV cache after its weights`
      : fits
        ? `fits ${device} at ZeRO stage ${s} (${gib(margin)} GiB to spare ${when})`
        : `does NOT fit ${device} at ZeRO stage ${s}: ${gib(-margin)} GiB short ${when}`,
  );
  return `${lines.join("\n")}\n`;
}
