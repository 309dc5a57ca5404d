/**
 * The memory plan of a `train` run: the bytes one device holds, its trainer rank and its
 * native engine replica, moment by moment. The sizes are the native code's own
 * (src/planning/native-sizes.ts: `searchr1-trainer plan` counts them with the code that
 * allocates them); this file adds them up as a step holds them (not measured, and not a rule
 * of thumb). `searchr1 train --dry-run` prints it (src/planning/dry-run.ts). What it follows:
 * - train/learner.h: a learner's compute copy, fp32 masters, AdamW moments and gradients at
 *   each ZeRO stage, and what its offloads (actor.* and critic.*_offload, verl's fsdp_config
 *   ones) keep in host memory instead, shown apart and in no device total.
 * - train/session.cpp: the trainer runs one command at a time (a model's log-probs, values or
 *   updates). A command holds its activations, and frees them when it ends; with param
 *   offload it brings its model's compute copy to the device and sends it back after; at
 *   stage 2 or with grad offload the gradients a pass computes are on the device during its
 *   updates only. So a moment holds what is kept throughout plus its largest command.
 * - train/session.cpp: the reference keeps its compute copy alone.
 * - backend/cuda: the cuBLASLt workspace, the attention's scratch (the largest pass's).
 * - cli/engine/main.cpp: the engine's compute copy, the buffers of its largest step, and its
 *   KV cache filling rollout.gpu_memory_utilization × the device's memory (vLLM's meaning)
 *   after them; with rollout.free_cache_engine the KV cache's memory and the step's buffers
 *   go back to the device while the trainer works (src/train/step.ts: after the rollouts,
 *   until the new weights are in).
 * Three moments of a step: the rollout (the engine's weights and KV cache, and all the
 * trainer keeps between commands), the log-probs and the updates (the engine's KV cache
 * unless it was released, and the largest command of the phase). The peak is the largest.
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
import { loraOn, loraSpec } from "./lora-spec.js";
import {
  type Device,
  type LearnerBytes,
  loraScratchOf,
  type ModelBytes,
  modelBytes,
  NO_OFFLOAD,
  type Offload,
  passOf,
} from "./native-sizes.js";

export const GiB = 2 ** 30;

export type ZeroStage = 0 | 1 | 2;
export type { Device, Offload };

/** A model as the plan needs it: a folder with its config.json, and its sizes from it. */
export interface PlanModel {
  dir: string;
  dims: ModelDims;
}

/**
 * trainer.zero_stage, null resolved: 0 on one rank, 2 on several; with LoRA 0 unless PPO's
 * critic, fully trained (critic.lora_rank 0), is there to shard (adapters' state is small).
 */
export function zeroStageOf(config: TrainConfig): ZeroStage {
  const ranks = config.trainer.gpus * config.trainer.nnodes;
  const full =
    !loraOn(config) || (config.algorithm.name === "ppo" && config.critic.lora_rank === 0);
  return (config.trainer.zero_stage ?? (ranks > 1 && full ? 2 : 0)) as ZeroStage;
}

/** A learner's offload keys as the plan takes them. */
export function offloadOf(l: {
  param_offload: boolean;
  grad_offload: boolean;
  optimizer_offload: boolean;
}): Offload {
  return { param: l.param_offload, grad: l.grad_offload, optimizer: l.optimizer_offload };
}

/** Everything the plan takes; planInput() derives it from a train config. */
export interface PlanInput {
  policy: PlanModel;
  /** The critic's model (critic.model_path), null without a critic (GRPO and the others). */
  critic: PlanModel | null;
  reference: boolean;
  /**
   * LoRA adapters on the policy (model.lora_*): the actor trains them alone on its frozen
   * base, and the reference is the policy with them off (no copy of its own).
   */
  lora?: { rank: number; targets: "all-linear" | string[] } | null;
  /** LoRA adapters on the critic (critic.lora_*), its value head trained beside them. */
  criticLora?: { rank: number; targets: "all-linear" | string[] } | null;
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
    lora: loraSpec(config),
    criticLora:
      ppo && config.critic.lora_rank > 0
        ? { rank: config.critic.lora_rank, targets: config.critic.target_modules }
        : null,
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

/** The trainer's commands (train/session.cpp), one at a time. */
export type Command =
  | "actor log-probs"
  | "actor update"
  | "reference log-probs"
  | "critic values"
  | "critic update";

/**
 * One line of the plan: the bytes at ZeRO stage 0, 1, 2 held during the rollouts, during the
 * log-probs (old, reference, values) and during the updates; `counted` false: shown for
 * comparison, in no total; `host`: held in host memory (an offload), in no device total;
 * `commands`: held only while one of these trainer commands runs (its activations, an
 * offloaded model's compute copy), so a moment's total counts its largest command's rows, not
 * every such row.
 */
export interface PlanRow {
  part: "actor" | "reference" | "critic" | "engine" | "trainer";
  item: string;
  rollout: Triple;
  logProbs: Triple;
  update: Triple;
  counted: boolean;
  host?: boolean;
  commands?: Command[];
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
  /** The native sizes the plan adds up: the policy's (and its engine's), the critic's. */
  sizes: { policy: ModelBytes; critic: ModelBytes | null };
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
const MOMENT_OF: Record<Command, Moment> = {
  "actor log-probs": "logProbs",
  "reference log-probs": "logProbs",
  "critic values": "logProbs",
  "actor update": "update",
  "critic update": "update",
};

/** The native sizes of the run's models (`searchr1-trainer plan`). */
export function planSizes(input: PlanInput): MemoryPlan["sizes"] {
  const { device, ranks, tokens } = input;
  const policy = modelBytes({
    dir: input.policy.dir,
    head: "lm",
    device,
    ranks,
    offload: input.actorOffload ?? NO_OFFLOAD,
    tokens: [tokens.update, tokens.logProbs],
    lora: input.lora ?? undefined,
    engine: input.engine
      ? { deviceGiB: input.deviceBytes / GiB, utilization: input.engine.utilization }
      : undefined,
  });
  const critic = input.critic
    ? modelBytes({
        dir: input.critic.dir,
        head: "value",
        device,
        ranks,
        offload: input.criticOffload ?? NO_OFFLOAD,
        tokens: [tokens.criticUpdate, tokens.values],
        lora: input.criticLora ?? undefined,
      })
    : null;
  return { policy, critic };
}

/** The plan: the native sizes of `input`'s models, added up moment by moment. */
export function memoryPlan(input: PlanInput, sizes = planSizes(input)): MemoryPlan {
  const { device, recompute, tokens } = input;
  const xName = device === "cuda" ? "bf16" : "fp32";
  const rows: PlanRow[] = [];
  // Held throughout (`update` omitted), or `rollout` during the rollouts, `update` during the
  // updates and `logProbs` (default: `update`) during the log-probs.
  const row = (
    part: PlanRow["part"],
    item: string,
    rollout: Triple,
    update: Triple = rollout,
    logProbs: Triple = update,
  ) => rows.push({ part, item, rollout, logProbs, update, counted: true });
  // Held while one of `commands` runs: `bytes` in the moments of those commands.
  const commandRow = (
    part: PlanRow["part"],
    item: string,
    commands: Command[],
    bytes: Triple,
    counted = true,
  ) => {
    const at = (m: Moment) => (commands.some((c) => MOMENT_OF[c] === m) ? bytes : same(0));
    rows.push({
      part,
      item,
      rollout: same(0),
      logProbs: at("logProbs"),
      update: at("update"),
      counted,
      commands,
    });
  };
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
  // A learner's compute copy: on the device throughout, or with param offload during its
  // commands only and in host memory between them.
  const weightsRows = (
    part: "actor" | "critic",
    name: string,
    offloaded: boolean,
    commands: [Command, Command],
    device: Triple,
    host: Triple,
  ) => {
    if (offloaded) {
      commandRow(part, `${name}, on the device during its commands only`, commands, device);
    } else {
      row(part, name, device);
    }
    hostRow(part, `${name} between its commands`, host);
  };
  const learnerRows = (
    part: "actor" | "critic",
    bytes: ModelBytes,
    offload: Offload,
    commands: [Command, Command],
  ) => {
    const pick = (k: keyof LearnerBytes) => bytes.learner.map((b) => b[k]) as Triple;
    const weights = `weights (${xName} compute copy)`;
    weightsRows(part, weights, offload.param, commands, pick("weights"), pick("hostWeights"));
    if (device === "cuda" && !offload.optimizer) row(part, "fp32 master weights", pick("masters"));
    if (!offload.optimizer) row(part, "AdamW moments (fp32 m, v)", pick("optimizer"));
    // Kept between updates (below stage 2 without grad offload: the whole buffer), or
    // during the updates only (stage 2: a shard and the backward's buckets).
    const between = pick("gradientsBetween");
    if (between.some((b) => b > 0)) row(part, "fp32 gradients, kept between updates", between);
    const during = byStage((s) =>
      between[s] > 0 ? 0 : (bytes.learner[s] as LearnerBytes).gradients,
    );
    commandRow(
      part,
      "fp32 gradients, during its updates only (stage 2: a shard and the backward's buckets)",
      [commands[1]],
      during,
    );
    hostRow(part, "fp32 master weights", pick("hostMasters"));
    hostRow(part, "AdamW moments (fp32 m, v)", pick("hostOptimizer"));
    hostRow(part, "fp32 gradients the step reads", pick("hostGradients"));
  };
  const tok = (n: number) => `${n.toLocaleString("en-US")} tokens`;
  const checkpointing = (yes: boolean) => `gradient checkpointing ${yes ? "on" : "off"}`;
  // A learner's activations: its update's micro-batch (and, for comparison, the same with
  // checkpointing the other way), and its forward pass.
  const actsRows = (
    part: "actor" | "critic",
    bytes: ModelBytes,
    train: number,
    forward: number,
    [forwardCommand, updateCommand]: [Command, Command],
    forwardName: string,
  ) => {
    const update = passOf(bytes, train);
    const on = update.backwardRecompute;
    const off = update.backward;
    commandRow(
      part,
      `activations, update micro-batch (${tok(train)}), ${checkpointing(recompute)}`,
      [updateCommand],
      same(recompute ? on : off),
    );
    commandRow(
      part,
      `activations, the same, ${checkpointing(!recompute)}`,
      [updateCommand],
      same(recompute ? off : on),
      false,
    );
    commandRow(
      part,
      `activations, ${forwardName} (${tok(forward)}, forward)`,
      [forwardCommand],
      same(passOf(bytes, forward).forward),
    );
  };

  // A learner with adapters: the frozen base's compute copy and the adapters' own state (their
  // moments sharded from ZeRO stage 1 on, their summed gradient too at stage 2).
  const adapterRows = (
    part: "actor" | "critic",
    bytes: ModelBytes,
    rank: number,
    offload: Offload,
    commands: [Command, Command],
  ) => {
    const lora = bytes.lora as NonNullable<ModelBytes["lora"]>;
    const pick = (k: keyof LearnerBytes) => lora.learner.map((b) => b[k]) as Triple;
    const bf16 = device === "cuda" ? " and their bf16 copy" : "";
    const head = part === "critic" ? " and the value head" : "";
    weightsRows(
      part,
      `weights (${xName} compute copy, frozen)`,
      offload.param,
      commands,
      pick("weights"),
      pick("hostWeights"),
    );
    row(part, `LoRA rank ${rank} adapters${head}: fp32 weights${bf16}`, pick("masters"));
    row(part, "LoRA adapters: AdamW moments (fp32 m, v)", pick("optimizer"));
    const between = pick("gradientsBetween");
    row(part, "LoRA adapters: fp32 gradients", between);
    commandRow(
      part,
      "LoRA adapters: fp32 gradients, during its updates only (stage 2)",
      [commands[1]],
      byStage((s) => (between[s] > 0 ? 0 : (lora.learner[s] as LearnerBytes).gradients)),
    );
  };
  // The scratch of a pass through the adapters (A x, its gradient and one module's output),
  // for each of `passes`: its tokens, its command and its name.
  const adapterScratchRows = (
    part: "actor" | "critic",
    bytes: ModelBytes,
    passes: [number, Command, string][],
  ) => {
    const scratch = "LoRA adapters' scratch (A x, its gradient, one module's output)";
    for (const [n, command, name] of passes) {
      commandRow(part, `${scratch}, ${name} (${tok(n)})`, [command], same(loraScratchOf(bytes, n)));
    }
  };

  const { policy, critic } = sizes;
  const actorCommands: [Command, Command] = ["actor log-probs", "actor update"];
  const lora = policy.lora;
  const actorOffload = input.actorOffload ?? NO_OFFLOAD;
  if (lora) adapterRows("actor", policy, input.lora?.rank ?? 0, actorOffload, actorCommands);
  else learnerRows("actor", policy, actorOffload, actorCommands);
  actsRows("actor", policy, tokens.update, tokens.logProbs, actorCommands, "log-prob micro-batch");
  if (lora) {
    adapterScratchRows("actor", policy, [
      [tokens.update, "actor update", "update micro-batch"],
      [tokens.logProbs, "actor log-probs", "log-prob micro-batch"],
    ]);
  }
  if (input.reference && lora) {
    commandRow(
      "reference",
      `activations, log-prob micro-batch (${tok(tokens.logProbs)}, forward; the policy with its adapters off: no copy of its own)`,
      ["reference log-probs"],
      same(passOf(policy, tokens.logProbs).forward),
    );
  } else if (input.reference) {
    const weights = `weights (${xName} compute copy)`;
    if (input.referenceOffload) {
      commandRow(
        "reference",
        `${weights}, on the device during its log-probs only`,
        ["reference log-probs"],
        same(policy.computeCopy),
      );
    } else {
      row("reference", weights, same(policy.computeCopy));
    }
    commandRow(
      "reference",
      `activations, log-prob micro-batch (${tok(tokens.logProbs)}, forward)`,
      ["reference log-probs"],
      same(passOf(policy, tokens.logProbs).forward),
    );
  }
  if (input.critic && critic) {
    const criticCommands: [Command, Command] = ["critic values", "critic update"];
    const offload = input.criticOffload ?? NO_OFFLOAD;
    const rank = input.criticLora?.rank ?? 0;
    if (critic.lora) adapterRows("critic", critic, rank, offload, criticCommands);
    else learnerRows("critic", critic, offload, criticCommands);
    actsRows(
      "critic",
      critic,
      tokens.criticUpdate,
      tokens.values,
      criticCommands,
      "values micro-batch",
    );
    if (critic.lora) {
      adapterScratchRows("critic", critic, [
        [tokens.criticUpdate, "critic update", "update micro-batch"],
        [tokens.values, "critic values", "values micro-batch"],
      ]);
    }
  }
  if (device === "cuda") {
    const scratch = Math.max(
      passOf(policy, tokens.update).attentionBackwardScratch,
      passOf(policy, tokens.logProbs).attentionForwardScratch,
      critic ? passOf(critic, tokens.criticUpdate).attentionBackwardScratch : 0,
    );
    row("trainer", "cuBLASLt workspace and attention scratch", same(policy.workspace + scratch));
  }

  const engine = input.engine ? policy.engine : null;
  if (input.engine && engine) {
    row("engine", `weights (${xName} compute copy)`, same(engine.weights));
    const kv = engine.kvBlocks * engine.kvBlock;
    const release = input.engine.release;
    row(
      "engine",
      `KV cache: ${input.engine.utilization} × device − weights, ` +
        `${(engine.kvBlocks * engine.blockSize).toLocaleString("en-US")} token positions` +
        (release ? " (released while the trainer works)" : ""),
      same(kv),
      same(release ? 0 : kv),
    );
    row(
      "engine",
      `buffers of its largest step (${engine.chunkTokens} prompt tokens and ` +
        `${engine.maxRunning} sequences of ${tok(engine.contextLength)})` +
        (release ? ", given back with the KV cache" : ""),
      same(engine.step),
      same(release ? 0 : engine.step),
    );
    if (engine.workspace > 0) row("engine", "cuBLASLt workspace", same(engine.workspace));
  }
  rows.push(...hostRows);
  // What is held throughout a moment, and its largest command's rows.
  const counted = rows.filter((r) => r.counted);
  const sum = (moment: Moment) =>
    byStage((s) => {
      const held = counted.reduce((t, r) => t + (r.commands ? 0 : r[moment][s]), 0);
      const commands = Object.keys(MOMENT_OF) as Command[];
      const largest = Math.max(
        0,
        ...commands.map((c) =>
          counted.reduce((t, r) => t + (r.commands?.includes(c) ? r[moment][s] : 0), 0),
        ),
      );
      return held + largest;
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
    engineRefuses: engine !== null && engine.refused !== null,
    sizes,
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
