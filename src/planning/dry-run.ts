/**
 * `searchr1 train --dry-run` (trainer.dry_run): the memory plan of one device for the run
 * the config describes (src/planning/memory-plan.ts), from the model folders' config.json
 * alone; it starts nothing and writes nothing.
 */
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { modelDims, readConfig } from "../ckpt/model-dims.js";
import type { TrainConfig } from "../config/schemas/train.js";
import { HubClient } from "../hub/client.js";
import { isRepoId } from "../hub/repo.js";
import { InputError } from "../runtime/errors.js";
import {
  type BatchSizes,
  batchSizes,
  type UpdateBatching,
  updateTokens,
} from "../trainer/batch-sizes.js";
import { formatPlan, memoryPlan, type PlanModel, planInput } from "./memory-plan.js";
import type { LearnerBytes, ModelBytes } from "./native-sizes.js";
import { stepTraffic, trafficLine } from "./traffic.js";

/** The plan's view of a Hugging Face folder (its config.json). */
export function readPlanModel(dir: string): PlanModel {
  return { dir, dims: modelDims(readConfig(join(dir, "config.json")), join(dir, "config.json")) };
}

/**
 * Runs `plan` with the plan's model for `path`: its folder's config.json or, where no such
 * folder exists and the path is a hub repository id (`Qwen/Qwen2.5-7B`), the config.json of
 * that repository on the hub (HF_ENDPOINT, HF_TOKEN, as `download`), in a temporary folder
 * removed after: the plan needs no weights.
 */
export async function withPlanModel<T>(
  path: string,
  env: Record<string, string | undefined>,
  plan: (m: PlanModel) => Promise<T>,
  signal?: AbortSignal,
): Promise<T> {
  const dir = resolve(path);
  if (existsSync(join(dir, "config.json")) || !isRepoId(path)) return plan(readPlanModel(dir));
  const endpoint = env.HF_ENDPOINT || "https://huggingface.co";
  const client = new HubClient({
    endpoint,
    token: env.HF_TOKEN || null,
    timeoutS: 30,
    retries: 2,
    backoffS: 1,
  });
  const where = `${endpoint.replace(/\/+$/, "")}/${path}/config.json`;
  let text: string;
  try {
    text = await client.readText(
      { id: path, type: "model", revision: "main" },
      "config.json",
      signal,
    );
  } catch (err) {
    throw new InputError(
      `model.path ${path}: no such folder here, and its config.json could not be read from the hub (${(err as Error).message})`,
    );
  }
  let config: unknown;
  try {
    config = JSON.parse(text);
  } catch (err) {
    throw new InputError(`${where}: invalid JSON (${(err as Error).message})`);
  }
  if (!config || typeof config !== "object" || Array.isArray(config)) {
    throw new InputError(`${where}: expected a JSON object`);
  }
  const dims = modelDims(config as Record<string, unknown>, where);
  const tmp = mkdtempSync(join(tmpdir(), "searchr1-plan-"));
  try {
    writeFileSync(join(tmp, "config.json"), text);
    return await plan({ dir: tmp, dims });
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

/**
 * A step's batch arithmetic: trajectories, optimizer steps and each rank's micro-batches, e.g.
 * Search-R1's v0.2 GRPO on 8 GPUs: 2,560 trajectories, 10 optimizer steps of 256, micro-batches
 * of 8 per rank.
 */
function batchLine(config: TrainConfig, b: BatchSizes, ranks: number): string {
  const size = (p: { microPerRank: number | null; tokensPerRank: number | null }) =>
    p.microPerRank !== null ? `${p.microPerRank}` : `${p.tokensPerRank} tokens`;
  const parts = [
    `a step: ${config.data.train_batch_size} prompts × ${b.group} = ${b.trajectories} trajectories; ` +
      `${b.optimizerSteps} optimizer steps of ${b.actor.miniBatch} (actor.ppo_mini_batch_size × rollout.n` +
      `${config.actor.ppo_epochs > 1 ? `, ${config.actor.ppo_epochs} epochs` : ""})`,
    `per rank of ${ranks}: micro-batches of ${size(b.actor)} (actor), log-prob passes of ${size(b.policyLogProbs)} ` +
      `(old) and ${size(b.refLogProbs)} (reference)` +
      (b.critic && b.values ? `, ${size(b.critic)} (critic) and ${size(b.values)} (values)` : ""),
  ];
  return parts.join("\n");
}

/** What `train --dry-run` prints. */
export async function dryRunText(
  config: TrainConfig,
  env: Record<string, string | undefined> = process.env,
): Promise<string> {
  const ppo = config.algorithm.name === "ppo";
  return withPlanModel(config.model.path, env, async (policy) =>
    ppo && config.critic.model_path !== null
      ? withPlanModel(config.critic.model_path, env, async (critic) =>
          planText(config, policy, critic),
        )
      : planText(config, policy, policy),
  );
}

function planText(config: TrainConfig, policy: PlanModel, critic: PlanModel): string {
  const input = planInput(config, policy, critic);
  const batches = batchSizes(config, input.ranks);
  const plan = memoryPlan(input);
  const { trainer } = config;
  const d = policy.dims;
  const stage =
    trainer.zero_stage === null
      ? `ZeRO stage ${input.stage} (trainer.zero_stage null: ${input.lora && (!input.critic || input.criticLora) ? "0 with LoRA" : input.ranks > 1 ? "2 on several ranks" : "0 on one rank"})`
      : `ZeRO stage ${input.stage}`;
  const title = [
    `memory plan of one device (its trainer rank and engine replica) of ${input.ranks} ` +
      `(trainer.gpus ${trainer.gpus} × trainer.nnodes ${trainer.nnodes}); * = the stage used`,
    `model ${config.model.path}: ${plan.parameters.toLocaleString("en-US")} parameters (${d.modelType}, ` +
      `${d.layers} layers, hidden ${d.hiddenSize}, ${d.tied ? "tied" : "untied"} embeddings)`,
    `${config.algorithm.name}${input.reference ? " with a reference policy" : ""}; trainer on ` +
      `${input.device === "cuda" ? (input.lora ? "CUDA (bf16 compute; the base frozen in bf16, the adapters' fp32 masters, moments and gradients)" : "CUDA (bf16 compute, fp32 masters, moments and gradients)") : "the CPU (fp32)"}; ${stage}`,
    `trajectories of at most ${input.trajectoryTokens} tokens (data.max_start_length + ` +
      "rollout.max_turns × (data.max_response_length + data.max_obs_length) + " +
      "data.max_response_length)",
    batchLine(config, batches, input.ranks),
  ].join("\n");
  const notes: string[] = [];
  if (input.ranks > 1) {
    const computeBytes = input.device === "cuda" ? 2 : 4;
    const learner = (bytes: ModelBytes, u: UpdateBatching) => ({
      // The padded buffer: the compute copy's elements at the run's stage.
      // With LoRA the adapters' buffer alone is all-reduced.
      floats:
        bytes.lora?.floats ?? (bytes.learner[input.stage] as LearnerBytes).weights / computeBytes,
      computeBytes,
      rowsPerRank: u.miniBatch / input.ranks,
      // A token budget's micro-batches counted as budget ÷ the longest trajectory.
      microBatch: Math.max(
        1,
        Math.floor(updateTokens(u, input.trajectoryTokens) / input.trajectoryTokens),
      ),
    });
    const learners = [learner(plan.sizes.policy, batches.actor)];
    if (batches.critic && plan.sizes.critic) {
      learners.push(learner(plan.sizes.critic, batches.critic));
    }
    notes.push(trafficLine(stepTraffic(learners, input.ranks, batches.optimizerSteps)));
  }
  const lora = plan.sizes.policy.lora;
  if (lora && input.lora) {
    const share = ((100 * lora.floats) / plan.parameters).toFixed(2);
    notes.push(
      `LoRA rank ${input.lora.rank} on ${[input.lora.targets].flat().join(", ")}: ${lora.floats.toLocaleString("en-US")} adapter floats (${share} % of the parameters) trained on the frozen base; the reference is the policy with its adapters off`,
    );
  }
  const criticLora = plan.sizes.critic?.lora;
  if (criticLora && input.criticLora) {
    notes.push(
      `the critic's LoRA rank ${input.criticLora.rank} on ${[input.criticLora.targets].flat().join(", ")}: ${criticLora.floats.toLocaleString("en-US")} floats (the adapters and the value head) trained on the frozen critic`,
    );
  }
  if (input.engineElsewhere) notes.push(`not on this device: ${input.engineElsewhere}`);
  if (input.device === "cuda") {
    notes.push(
      "not counted: each process's CUDA context (about 0.5 GiB), the allocator's fragmentation",
    );
  }
  return formatPlan(plan, title) + notes.map((n) => `${n}\n`).join("");
}
