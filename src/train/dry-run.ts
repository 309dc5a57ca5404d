/**
 * `searchr1 train --dry-run` (trainer.dry_run): the memory plan of one device for the run
 * the config describes (src/train/memory-plan.ts), from the model folders' config.json
 * alone; it starts nothing and writes nothing.
 */
import { join, resolve } from "node:path";
import { modelDims, readConfig } from "../ckpt/model-dims.js";
import type { TrainConfig } from "../config/schemas/train.js";
import {
  formatPlan,
  memoryPlan,
  type PlanModel,
  paddedFloats,
  paramLayout,
  planInput,
} from "./memory-plan.js";
import { stepTraffic, trafficLine } from "./traffic.js";

/** The plan's view of a Hugging Face folder's config.json. */
export function readPlanModel(dir: string): PlanModel {
  const path = join(dir, "config.json");
  const config = readConfig(path);
  const dims = modelDims(config, path);
  return { dims, attentionBias: dims.modelType === "qwen2" || config.attention_bias === true };
}

/** What `train --dry-run` prints. */
export function dryRunText(config: TrainConfig): string {
  const model = resolve(config.model.path);
  const policy = readPlanModel(model);
  const ppo = config.algorithm.name === "ppo";
  const critic = ppo ? readPlanModel(resolve(config.critic.model_path ?? model)) : policy;
  const input = planInput(config, policy, critic);
  const plan = memoryPlan(input);
  const { trainer } = config;
  const d = policy.dims;
  const stage =
    trainer.zero_stage === null
      ? `ZeRO stage ${input.stage} (trainer.zero_stage null: ${input.ranks > 1 ? "2 on several ranks" : "0 on one rank"})`
      : `ZeRO stage ${input.stage}`;
  const title = [
    `memory plan of one device (its trainer rank and engine replica) of ${input.ranks} ` +
      `(trainer.gpus ${trainer.gpus} × trainer.nnodes ${trainer.nnodes}); * = the stage used`,
    `model ${config.model.path}: ${plan.parameters.toLocaleString("en-US")} parameters (${d.modelType}, ` +
      `${d.layers} layers, hidden ${d.hiddenSize}, ${d.tied ? "tied" : "untied"} embeddings)`,
    `${config.algorithm.name}${input.reference ? " with a reference policy" : ""}; trainer on ` +
      `${input.device === "cuda" ? "CUDA (bf16 compute, fp32 masters, moments and gradients)" : "the CPU (fp32)"}; ${stage}`,
    `trajectories of at most ${input.trajectoryTokens} tokens (data.max_start_length + ` +
      "rollout.max_turns × (data.max_response_length + data.max_obs_length) + " +
      "data.max_response_length); micro-batches of actor.ppo_micro_batch_size, " +
      "rollout.log_prob_micro_batch_size and critic.ppo_micro_batch_size of them per rank",
  ].join("\n");
  const notes: string[] = [];
  if (input.ranks > 1) {
    // The critic shares the actor's mini-batches and epochs (src/train/step.ts).
    const { actor, rollout, data } = config;
    const rowsPerRank = Math.ceil((actor.ppo_mini_batch_size * rollout.n) / input.ranks);
    const learner = (m: PlanModel, head: "lm" | "value", microBatch: number) => ({
      floats: paddedFloats(paramLayout(m, head).floats, input.ranks, input.stage),
      computeBytes: input.device === "cuda" ? 2 : 4,
      rowsPerRank,
      microBatch,
    });
    const learners = [learner(policy, "lm", actor.ppo_micro_batch_size)];
    if (ppo) learners.push(learner(critic, "value", config.critic.ppo_micro_batch_size));
    const optimizerSteps =
      Math.ceil(data.train_batch_size / actor.ppo_mini_batch_size) * actor.ppo_epochs;
    notes.push(trafficLine(stepTraffic(learners, input.ranks, optimizerSteps)));
  }
  if (input.engineElsewhere) notes.push(`not on this device: ${input.engineElsewhere}`);
  if (input.device === "cuda") {
    notes.push(
      "not counted: each process's CUDA context (about 0.5 GiB), the engine's block tables " +
        "(at most 2 MiB), the allocator's fragmentation",
    );
  }
  return formatPlan(plan, title) + notes.map((n) => `${n}\n`).join("");
}
