import { existsSync, mkdirSync, rmSync } from "node:fs";
import { join, resolve } from "node:path";
import { stringify } from "yaml";
import { AgentSession, agentSettings } from "../agent/session.js";
import { rawConfig } from "../config/key-reads.js";
import type { TrainConfig } from "../config/schemas/train.js";
import { firstPerSource, readQaItems } from "../data/qa-items.js";
import { answerItems } from "../eval/answer-items.js";
import { summarize } from "../eval/report.js";
import { zeroStageOf } from "../planning/memory-plan.js";
import { adaptiveKlController, fixedKlController } from "../rl/kl-controller.js";
import { parseRolloutRs } from "../rl/rollout-correction.js";
import { CliError, InputError, UsageError } from "../runtime/errors.js";
import { writeFileAtomic } from "../runtime/write-atomic.js";
import { ModelTokenizer } from "../text/model-tokenizer.js";
import { MetricsLog, type MetricsRow } from "../tracking/metrics-log.js";
import { writePlots } from "../tracking/plots.js";
import { ProfileLog, profileSummary } from "../tracking/profile-log.js";
import { openTrackers, type Trackers, trackerSettings } from "../tracking/trackers.js";
import { batchSizes } from "../trainer/batch-sizes.js";
import { startTrainer } from "../trainer/group.js";
import type { OptimFields } from "../trainer/protocol.js";
import type { Trainer } from "../trainer/trainer.js";
import {
  type ControllerState,
  checkpointDir,
  completeCheckpoint,
  latestCheckpoint,
  readCheckpoint,
} from "./checkpoints.js";
import { DataOrder } from "./data-order.js";
import { formatMetric, nonFiniteMetrics, nullableMetrics, RunHealth } from "./health.js";
import { criticLoraLoad, loraLoad } from "./lora.js";
import { checkNodes, openNodes } from "./nodes.js";
import { placeRun } from "./placement.js";
import { policySettings, pushWeights, type StepContext, trainStep } from "./step.js";

/** What a run shows as it goes (a live view on a terminal, plain lines otherwise). */
export interface TrainView {
  log(line: string): void;
  phase(step: number, total: number, phase: string): void;
  stepDone(row: MetricsRow, total: number): void;
}

/**
 * What a run leaves in its folder beside config.yaml, in the order the closing line names
 * them; which of them a run writes depends on trainer.logger, validation, trainer.profile and
 * whether a step was checkpointed.
 */
const OUTPUTS = [
  "metrics.jsonl",
  "plots/",
  "tensorboard/",
  "validation/",
  "profile.jsonl",
  "global_step_*/",
] as const;
export type RunOutput = (typeof OUTPUTS)[number];

/** A finished run: its folder and what it wrote there. */
export interface TrainResult {
  dir: string;
  wrote: RunOutput[];
}

/** Where a run writes: trainer.default_local_dir, or `<output_dir>/<project>/<experiment>`. */
export function runDirOf(config: TrainConfig): string {
  const { output_dir, project_name, experiment_name, default_local_dir } = config.trainer;
  return resolve(default_local_dir ?? join(output_dir, project_name, experiment_name));
}

/**
 * `searchr1 train`: starts the trainer, the engine and (from retriever.index) the retriever
 * as child processes, resumes from the latest checkpoint when there is one, validates before
 * training and every test_freq steps, runs the steps, checkpoints every save_freq steps, and
 * keeps the metrics and plots of trainer.logger up to date. A child that dies stops the run
 * with its last words; the checkpoints on disk stay as they were.
 */
export async function runTrain(
  config: TrainConfig,
  view: TrainView,
  signal: AbortSignal,
): Promise<TrainResult> {
  check(config);
  const batches = batchSizes(config, config.trainer.gpus * config.trainer.nnodes);
  // W&B's environment (WANDB_API_KEY, ...) is checked before anything is written.
  const trackerEnv = trackerSettings(config);
  // trainer.gpus ranks, data parallel, and as many engine replicas: rank r and replica r on
  // device r (or all on the CPU); refused here, before anything is written, if it cannot be.
  const placement = await placeRun(config);
  const model = resolve(config.model.path);
  const tokenizer = ModelTokenizer.load(config.model.tokenizer_path ?? model);
  // trainer.val_only trains on nothing: the training files are not read.
  const train = config.trainer.val_only ? [] : await readQaItems(config.data.train_files);
  const val = config.data.val_files.length ? await readQaItems(config.data.val_files) : [];
  const validation =
    config.data.val_max_samples === null ? val : firstPerSource(val, config.data.val_max_samples);
  const order = new DataOrder(
    train,
    config.data.train_batch_size,
    config.data.seed,
    config.data.shuffle,
  );
  if (order.batchesPerEpoch === 0 && !config.trainer.val_only) {
    throw new InputError(
      `data.train_batch_size is ${config.data.train_batch_size} but ${config.data.train_files.join(", ")} ` +
        `hold ${train.length} questions: lower it`,
    );
  }
  const totalSteps =
    config.trainer.total_training_steps ?? config.trainer.total_epochs * order.batchesPerEpoch;

  const runDir = runDirOf(config);
  mkdirSync(runDir, { recursive: true });
  writeFileAtomic(join(runDir, "config.yaml"), stringify(rawConfig(config)));
  const resumed = resumePoint(config, runDir);
  const { logger, log_every } = config.trainer;
  const metrics = new MetricsLog(logger.includes("jsonl") ? join(runDir, "metrics.jsonl") : null);
  const wrote = new Set<string>();
  if (metrics.path) wrote.add("metrics.jsonl");
  // A console line every log_every steps, and for the last step and every validation.
  const show = (row: MetricsRow, last: boolean) => {
    if (!logger.includes("console")) return;
    if (row.step % log_every === 0 || last || row["val/em/mean"] !== undefined)
      view.stepDone(row, totalSteps);
  };
  metrics.truncateAfter(resumed?.state.step ?? null);
  // Collapse warnings (health.ts) over the whole run: the rows kept so far first.
  const nullable = nullableMetrics(config.actor.use_kl_loss);
  const health = new RunHealth(nullable);
  health.replay(metrics.rows());
  const record = (row: MetricsRow) => {
    const report = health.observe(row);
    for (const warning of report.warnings) view.log(`warning: ${warning}`);
    return report;
  };
  view.log(
    `run folder ${runDir}: ${totalSteps} steps of ${config.data.train_batch_size} prompts × ${batches.group}, ${batches.optimizerSteps} optimizer steps each`,
  );
  for (const note of placement.notes) view.log(note);
  // The weights the engine loads each step, in memory (on several nodes, each node's copy in
  // its own).
  const exportsDir = existsSync("/dev/shm")
    ? join("/dev/shm", `searchr1-${process.pid}`)
    : join(runDir, "weights");
  // Several nodes: the others join here first; their ranks and replicas follow node 0's.
  const nodes =
    config.trainer.nnodes > 1
      ? await openNodes(config, placement, runDir, exportsDir, (line) => view.log(line), signal)
      : null;
  mkdirSync(exportsDir, { recursive: true });
  let exitCode = 1;
  let lastSaved = resumed?.state.step ?? null;
  let stopped: string | null = null;
  let trainer: Trainer | null = null;
  let session: AgentSession | null = null;
  let trackers: Trackers | null = null;
  try {
    trainer = await startTrainer({
      ranks: config.trainer.gpus * config.trainer.nnodes,
      device: placement.trainer.device,
      devices: nodes ? nodes.rankDevices : placement.trainer.devices,
      nodes: nodes?.ranks,
      threads: config.trainer.threads,
      recompute: config.actor.gradient_checkpointing,
      profile: config.trainer.profile,
      onLine: (line) => view.log(`trainer: ${line}`),
      signal,
    });
    trackers = await openTrackers(
      config,
      runDir,
      resumed ? resumed.state.step + 1 : 0,
      trackerEnv,
      (line) => view.log(line),
    );
    for (const output of trackers.wrote) wrote.add(output);
    const ppo = config.algorithm.name === "ppo";
    const needRef = config.actor.use_kl_loss || config.algorithm.use_kl_in_reward;
    const optimizerSteps = totalSteps * batches.optimizerSteps;
    // With LoRA the reference is the policy with its adapters off: no second model loaded.
    const lora = loraLoad(config);
    const criticLora = criticLoraLoad(config);
    const loaded = await trainer.load({
      policy: model,
      reference: needRef && !lora ? model : undefined,
      reference_offload: needRef && !lora ? config.ref.param_offload : undefined,
      critic: ppo ? resolve(config.critic.model_path ?? model) : undefined,
      actor_optim: optim(
        config.actor,
        config.actor.lr_warmup_steps_ratio,
        optimizerSteps,
        config.actor.lr_scheduler,
      ),
      critic_optim: ppo
        ? optim(config.critic, config.critic.lr_warmup_steps_ratio, optimizerSteps, "constant")
        : undefined,
      seed: config.data.seed,
      // The learners' state sharded over the ranks (native/src/train/learner.h).
      zero_stage: zeroStageOf(config),
      // What each learner keeps in host memory (verl's fsdp_config offloads).
      // With LoRA the frozen base alone (loraLoad refused the rest).
      actor_offload: {
        param: config.actor.param_offload,
        grad: !lora && config.actor.grad_offload,
        optimizer: !lora && config.actor.optimizer_offload,
      },
      critic_offload: ppo
        ? {
            param: config.critic.param_offload,
            grad: config.critic.grad_offload,
            optimizer: config.critic.optimizer_offload,
          }
        : undefined,
      lora,
      critic_lora: criticLora,
    });
    for (const [whose, l] of [
      ["LoRA", loaded.lora],
      ["the critic's LoRA", loaded.critic_lora],
    ] as const) {
      if (!l) continue;
      const head = l.value_head ? " and the value head" : "";
      view.log(
        `${whose}: rank ${l.rank}, scaling ${l.scaling} on ${l.target_modules.join(", ")}${head}: ${l.trainable_parameters} trainable parameters of ${loaded.parameters} (the base frozen)`,
      );
    }
    if (resumed) {
      await trainer.loadCheckpoint({ dir: resumed.dir });
      view.log(`resuming from ${resumed.dir} (step ${resumed.state.step})`);
    }
    const profile = config.trainer.profile
      ? new ProfileLog(runDir, resumed?.state.step ?? null)
      : null;
    await profile?.start(trainer);
    if (profile) wrote.add("profile.jsonl");
    session = await AgentSession.open(
      config,
      model,
      (line) => view.log(line),
      signal,
      nodes?.engine ?? placement.engine,
    );
    trainer.onDeath((err) => session?.fail(err.message));

    let currentStep = resumed?.state.step ?? 0;
    const ctx: StepContext = {
      config,
      tokenizer,
      session,
      trainer,
      order,
      batches,
      kl: resumed
        ? klController(config, resumed.state.klCoef)
        : klController(config, config.algorithm.kl_coef),
      // A checkpoint from before dynamic sampling drew one batch per step.
      genBatches: resumed ? (resumed.state.genBatches ?? resumed.state.step) : 0,
      exportsDir,
      ...(lora ? { lora: { adapterLoaded: false } } : {}),
      nodeExports: nodes?.exports,
      onPhase: (phase) => view.phase(currentStep, totalSteps, phase),
    };
    // The engine serves the base model; a resumed run's policy is the checkpoint's. With
    // LoRA the adapter goes to the engine before the first rollout too (a fresh one leaves
    // the base's outputs as they are; model.lora_adapter_path's changes them).
    if (resumed || lora) await pushWeights(ctx, currentStep);

    const validate = async (step: number): Promise<Record<string, number>> => {
      if (validation.length === 0) return {};
      view.phase(step, totalSteps, "validate");
      const records = await answerItems(
        validation,
        tokenizer,
        (session as AgentSession).parts(tokenizer.tokenizer),
        {
          settings: policySettings(ctx, { temperature: 0, topP: 1, topK: -1 }),
          concurrency: config.data.val_batch_size,
          seed: null,
          reward: config.reward,
          signal: (session as AgentSession).signal,
        },
      );
      const dir = join(runDir, "validation");
      mkdirSync(dir, { recursive: true });
      writeFileAtomic(
        join(dir, `step_${step}.jsonl`),
        records.map((r) => `${JSON.stringify(r)}\n`).join(""),
      );
      wrote.add("validation/");
      const report = summarize(records, {});
      return {
        ...Object.fromEntries(
          Object.entries(report.sources).map(([s, v]) => [`val/em/${s}`, v.em]),
        ),
        "val/em/mean": report.average.em,
        "val/searches/mean": report.average.searches,
      };
    };

    try {
      // trainer.val_only: one validation at the current step, then no training (verl's).
      const { val_only, val_before_train } = config.trainer;
      if (val_only || (currentStep === 0 && val_before_train)) {
        const row = { step: currentStep, ...(await validate(currentStep)) };
        record(row);
        if (!val_only) metrics.append(row);
        trackers.log(row, []);
        show(row, val_only);
      }
      while (!val_only && currentStep < totalSteps) {
        const step = currentStep + 1;
        currentStep = step;
        const row = await trainStep(ctx, step);
        const profiled = await profile?.record(trainer, step);
        if (profiled?.[0] && step === (resumed?.state.step ?? 0) + 1) {
          view.log(
            `profile, step ${step}, rank 0: ${profileSummary(profiled[0])} (all: ${profile?.path})`,
          );
        }
        const last = step === totalSteps;
        // trainer.stop_on_nan: a step with a NaN or ±Inf metric is neither validated nor
        // checkpointed; its row is logged, then the run stops.
        const stop = config.trainer.stop_on_nan && nonFiniteMetrics(row, nullable).length > 0;
        if (!stop && (step % config.trainer.test_freq === 0 || last))
          Object.assign(row, await validate(step));
        const { nonFinite } = record(row);
        // The row before the checkpoint: a run resumed from step N keeps rows up to N.
        metrics.append(row);
        const save = !stop && (step % config.trainer.save_freq === 0 || last);
        if (save) {
          view.phase(step, totalSteps, "checkpoint");
          const dir = checkpointDir(runDir, step);
          await trainer.saveCheckpoint({ dir, overwrite: true });
          completeCheckpoint(runDir, {
            step,
            klCoef: ctx.kl.value,
            genBatches: ctx.genBatches,
          } satisfies ControllerState);
          lastSaved = step;
        }
        const plots = logger.includes("plot")
          ? await writePlots(metrics.rows(), join(runDir, "plots"))
          : [];
        if (plots.length) wrote.add("plots/");
        // W&B gets the plots as images at the steps that checkpoint.
        trackers.log(row, save ? plots : []);
        show(row, last || stop);
        if (stop) throw diverged(step, row, nonFinite, runDir, lastSaved);
      }
      exitCode = 0;
    } catch (err) {
      throw await session.failure(err);
    }
  } catch (err) {
    // What the other nodes are told when the run stops here.
    stopped = signal.aborted
      ? "interrupted on node 0"
      : (String((err as Error)?.message ?? err).split("\n")[0] as string);
    throw err;
  } finally {
    await trackers?.close(exitCode);
    await session?.close();
    await trainer?.shutdown();
    nodes?.master.close(stopped);
    if (nodes) rmSync(nodes.shared, { recursive: true, force: true });
    rmSync(exportsDir, { recursive: true, force: true });
  }
  // A resumed run's checkpoints count too: the run folder holds them.
  if (lastSaved !== null) wrote.add("global_step_*/");
  return { dir: runDir, wrote: OUTPUTS.filter((o) => wrote.has(o)) };
}

/**
 * The error that stops a run at step `step` under trainer.stop_on_nan: the first metric that
 * is not finite (and how many more), and the checkpoint left as the last.
 */
function diverged(
  step: number,
  row: MetricsRow,
  nonFinite: readonly string[],
  runDir: string,
  lastSaved: number | null,
): CliError {
  const [first, ...more] = nonFinite;
  const value = row[first as string];
  return new CliError(
    `step ${step}: ${first} is ${formatMetric(value)}${value === null ? " (the trainer's NaN or ±Inf)" : ""}` +
      `${more.length ? `, and ${more.length} more metric(s) are not finite (${more.join(", ")})` : ""}; ` +
      `trainer.stop_on_nan stopped the run without checkpointing step ${step}: ` +
      (lastSaved === null
        ? "no checkpoint was written"
        : `the last checkpoint, ${checkpointDir(runDir, lastSaved)}, is intact`) +
      ". Lower actor.lr (or actor.grad_clip), or set trainer.stop_on_nan=false to go on regardless",
    1,
  );
}

/** What this build refuses up front, each naming its key. */
function check(config: TrainConfig): void {
  checkNodes(config);
  checkReference(config);
  if (config.rollout.engine === "vllm") {
    throw new UsageError(
      "rollout.engine=vllm: train pushes new weights into the engine after every step, which " +
        "a vLLM server offers only in its dev mode; use the native engine or SGLang",
    );
  }
  checkDapoAndRolloutCorrection(config);
  // model.lora_* and critic.lora_*: refused here, before anything is written, when the
  // trainer cannot run them.
  loraLoad(config);
  criticLoraLoad(config);
  // The agent's refusals and rollout.multi_turn.tool_config_path, before anything starts.
  agentSettings(config, { temperature: 0, topP: 1, topK: -1 });
  if (!existsSync(join(resolve(config.model.path), "config.json"))) {
    throw new InputError(
      `${resolve(config.model.path)}: not a Hugging Face model folder (no config.json) (model.path)`,
    );
  }
}

/** ref.param_offload needs a reference policy to offload. */
function checkReference(config: TrainConfig): void {
  if (config.ref.param_offload && !config.actor.use_kl_loss && !config.algorithm.use_kl_in_reward) {
    throw new UsageError(
      "ref.param_offload=true: this run has no reference policy to offload " +
        "(actor.use_kl_loss and algorithm.use_kl_in_reward are false)",
    );
  }
}

/**
 * What the schema cannot say about algorithm.rollout_correction, algorithm.filter_groups and
 * reward.overlong_buffer: a combination that cannot work is refused naming the key.
 */
function checkDapoAndRolloutCorrection(config: TrainConfig): void {
  const { rollout_is, rollout_rs, rollout_rs_threshold } = config.algorithm.rollout_correction;
  if (rollout_rs !== null) {
    try {
      parseRolloutRs(rollout_rs, rollout_rs_threshold);
    } catch (err) {
      throw new UsageError((err as Error).message);
    }
  } else if (rollout_rs_threshold !== null) {
    throw new UsageError(
      `algorithm.rollout_correction.rollout_rs_threshold=${rollout_rs_threshold} has no effect ` +
        "without algorithm.rollout_correction.rollout_rs: set both, or neither",
    );
  }
  if ((rollout_is !== null || rollout_rs !== null) && config.rollout.compat !== "none") {
    throw new UsageError(
      `algorithm.rollout_correction (rollout_is=${rollout_is}, rollout_rs=${rollout_rs}) needs the ` +
        `engine's log-probs, which rollout.compat=${config.rollout.compat} drops`,
    );
  }
  const filter = config.algorithm.filter_groups;
  if (filter.enable && filter.metric === "seq_final_reward" && config.algorithm.use_kl_in_reward) {
    throw new UsageError(
      "algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward: the " +
        "in-reward KL is known only after the filter here; use seq_reward",
    );
  }
  const buffer = config.reward.overlong_buffer;
  if (buffer.enable && buffer.len > config.data.max_response_length) {
    throw new UsageError(
      `reward.overlong_buffer.len=${buffer.len} is longer than data.max_response_length=` +
        `${config.data.max_response_length}, the limit it counts back from`,
    );
  }
}

function resumePoint(config: TrainConfig, runDir: string) {
  const { resume } = config.trainer;
  if (resume === "disable") return null;
  if (resume === "auto") return latestCheckpoint(runDir);
  return readCheckpoint(resolve(resume), true);
}

function klController(config: TrainConfig, value: number) {
  const { algorithm } = config;
  return algorithm.kl_ctrl === "adaptive"
    ? adaptiveKlController(value, algorithm.target_kl, algorithm.kl_horizon)
    : fixedKlController(value);
}

function optim(
  section: {
    lr: number;
    weight_decay: number;
    grad_clip: number;
    betas?: readonly [number, number];
  },
  warmupRatio: number,
  totalSteps: number,
  schedule: "constant" | "cosine",
): OptimFields {
  const warmup = Math.floor(warmupRatio * totalSteps);
  return {
    lr: section.lr,
    lr_schedule: schedule === "cosine" ? "cosine" : warmup > 0 ? "linear-warmup" : "constant",
    warmup_steps: warmup,
    total_steps: totalSteps,
    weight_decay: section.weight_decay,
    grad_clip: section.grad_clip,
    ...(section.betas ? { beta1: section.betas[0], beta2: section.betas[1] } : {}),
  };
}
