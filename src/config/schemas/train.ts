import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";
import {
  adapterPathField,
  agentEnv,
  generationFields,
  lengthFields,
  loggingFields,
  loraRankField,
  modelCompat,
  modelSection,
  positiveInt,
  retrieverSection,
  threadsField,
} from "./shared.js";

/** The linear layers a LoRA adapter may target, in PEFT's module names (native/src/model/lora.h). */
export const LORA_MODULES = [
  "q_proj",
  "k_proj",
  "v_proj",
  "o_proj",
  "gate_proj",
  "up_proj",
  "down_proj",
] as const;

/** Which linear layers of every layer get LoRA adapters (`whose`: "the", "the critic's"). */
const targetModulesField = (whose: string) =>
  z
    .union([z.literal("all-linear"), z.array(z.enum(LORA_MODULES)).min(1)])
    .default("all-linear")
    .describe(
      `${whose} linear layers given adapters in every layer: all-linear, or a list of ${LORA_MODULES.join(", ")}`,
    );

/**
 * verl's LoRA keys of actor_rollout_ref.model (verl/trainer/config/model/hf_model.yaml), plus
 * PEFT's use_rslora: adapters trained on the frozen policy by the native trainer
 * (native/src/train/SERVE.md, "LoRA"); src/train/lora.ts turns them into the trainer's `lora`.
 */
const loraFields = {
  lora_rank: loraRankField(
    "LoRA rank r: > 0 trains adapters A [r, in], B [out, r] on the frozen model (PEFT's init: B = 0), the reference being the model with its adapters off; 0 = full fine-tuning (LoRA is also on with model.lora_adapter_path). CPU-tested; its CUDA path has not yet run on a GPU",
  ),
  lora_alpha: z
    .number()
    .positive()
    .default(16)
    .describe("LoRA's alpha: the adapters' output is scaled by lora_alpha / r"),
  target_modules: targetModulesField("the"),
  exclude_modules: z
    .array(z.string())
    .nullable()
    .default(null)
    .describe(
      `layers taken out of target_modules, in every layer: a list of ${LORA_MODULES.join(", ")}; PEFT's regex, or one layer's module name, is refused`,
    ),
  lora_adapter_path: adapterPathField(
    "a PEFT adapter folder (adapter_config.json, adapter_model.safetensors) to start training from, with its own r, lora_alpha, target_modules and use_rslora (model.lora_* keys set beside it must match them); null = a fresh adapter",
  ),
  use_rslora: z
    .boolean()
    .default(false)
    .describe("rank-stabilized LoRA (PEFT's use_rslora): scale by lora_alpha / sqrt(r)"),
};

const klType = z.enum(["kl", "abs", "mse", "low_var_kl"]);

/**
 * verl's fsdp_config offloads of one learner (actor or critic), as Search-R1's scripts set
 * them: what the trainer keeps in host memory instead of on the device (native/src/train/
 * learner.h). Only where the values live changes: on the CPU the run is the same bit for bit.
 */
function offloadFields(learner: string, model: string) {
  const untested = "; its CUDA path has not yet run on a GPU";
  return {
    param_offload: z
      .boolean()
      .default(false)
      .describe(
        `verl's fsdp_config.param_offload: ${model} compute copy (bf16) waits in host memory while the engine generates and comes to the device for its log-probs and updates (as ref.param_offload does the reference's)${untested}`,
      ),
    grad_offload: z
      .boolean()
      .default(false)
      .describe(
        `verl's fsdp_config.grad_offload: ${learner} fp32 gradient for the optimizer step lives in host memory (at ZeRO stage 2 its shard, added to as the backward reduces each region; below it, the device's buffer moved out before each step, so the device holds none between updates)${untested}`,
      ),
    optimizer_offload: z
      .boolean()
      .default(false)
      .describe(
        `verl's fsdp_config.optimizer_offload: ${learner} fp32 master weights and AdamW moments live in host memory and the AdamW step runs on the CPU (DeepSpeed's ZeRO-Offload), the updated weights copied to the device${untested}`,
      ),
  };
}

/**
 * verl's micro-batching of one log-prob pass: `rollout.*` for the policy's old log-probs,
 * `ref.*` for the reference's, whose unset keys take the rollout's (`inherit`).
 */
function logProbBatchFields(
  pass: string,
  inherit: { micro: string; dynamic: string; tokens: string } | null,
) {
  const orInherit = (key: string | undefined) => (key ? `; null = ${key}` : "");
  return {
    log_prob_micro_batch_size: positiveInt()
      .nullable()
      .default(inherit ? null : 128)
      .describe(
        `trajectories per forward pass of ${pass} over all ranks, divided by the data-parallel size${orInherit(inherit?.micro)}`,
      ),
    log_prob_micro_batch_size_per_gpu: positiveInt()
      .nullable()
      .default(null)
      .describe(`trajectories per forward pass of ${pass} on each rank, taken as given`),
    log_prob_use_dynamic_bsz: z
      .boolean()
      .nullable()
      .default(null)
      .describe(
        `passes of ${pass} by tokens: ⌊log_prob_max_token_len_per_gpu ÷ the longest trajectory⌋ trajectories each; null = ${inherit?.dynamic ?? "actor.use_dynamic_bsz"}`,
      ),
    log_prob_max_token_len_per_gpu: positiveInt()
      .nullable()
      .default(null)
      .describe(
        `log_prob_use_dynamic_bsz: tokens per pass of ${pass} on each rank; null = ${inherit?.tokens ?? "actor.ppo_max_token_len_per_gpu"}`,
      ),
  };
}

export const trainSchema = z.strictObject({
  algorithm: z
    .strictObject({
      name: z
        .enum(["grpo", "ppo", "reinforce_plus_plus", "rloo"])
        .default("grpo")
        .describe("grpo, ppo (GAE with a critic), reinforce_plus_plus or rloo"),
      gamma: z.number().min(0).max(1).default(1).describe("PPO: GAE discount"),
      lam: z.number().min(0).max(1).default(1).describe("PPO: GAE lambda"),
      norm_adv_by_std_in_grpo: z
        .boolean()
        .default(true)
        .describe("GRPO: divide by the group std (false = Dr. GRPO)"),
      use_kl_in_reward: z
        .boolean()
        .default(false)
        .describe(
          "subtract kl_coef·KL(old‖ref) from the token rewards (Search-R1's PPO scripts: true)",
        ),
      kl_penalty: klType.default("kl").describe("estimator for the in-reward KL"),
      kl_coef: z
        .number()
        .min(0)
        .default(0.001)
        .describe("coefficient of the in-reward KL (the adaptive controller's starting value)"),
      kl_ctrl: z
        .enum(["fixed", "adaptive"])
        .default("fixed")
        .describe("in-reward KL coefficient: fixed, or adapted toward target_kl after each step"),
      target_kl: z
        .number()
        .positive()
        .default(0.1)
        .describe("adaptive kl_ctrl: the mean KL per token to steer toward"),
      kl_horizon: positiveInt()
        .default(10000)
        .describe(
          "adaptive kl_ctrl: horizon in trajectories; a step moves the coefficient by ≤ 20%·batch/horizon",
        ),
      // verl's algorithm.rollout_correction (verl/trainer/config/algorithm/rollout_correction.yaml,
      // docs/algo/rollout_corr.md; decoupled mode): src/rl/rollout-correction.ts.
      rollout_correction: z
        .strictObject({
          rollout_is: z
            .enum(["token", "sequence"])
            .nullable()
            .default(null)
            .describe(
              "importance weights π_old/π_rollout (trainer over engine) on the policy loss: token, sequence (product over the response), or null = none",
            ),
          rollout_is_threshold: z
            .number()
            .positive()
            .default(2)
            .describe("truncation cap of the importance weights: min(weight, this)"),
          rollout_is_batch_normalize: z
            .boolean()
            .default(false)
            .describe("divide the truncated weights by their batch mean (mean 1)"),
          rollout_rs: z
            .string()
            .min(1)
            .nullable()
            .default(null)
            .describe(
              "rejection of tokens or sequences whose mismatch is out of bounds: comma-separated token_k1|k2|k3, seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3; null = none",
            ),
          rollout_rs_threshold: z
            .union([z.number().positive(), z.string().min(1)])
            .nullable()
            .default(null)
            .describe(
              "bounds of rollout_rs, one for all or one per option (comma-separated): a k1 option takes lower_upper on π_rollout/π_old (one number u means 1/u_u), the others an upper bound on their k2/k3 statistic",
            ),
        })
        .prefault({}),
      // DAPO's dynamic sampling as verl's DAPO recipe names it (algorithm.filter_groups).
      filter_groups: z
        .strictObject({
          enable: z
            .boolean()
            .default(false)
            .describe(
              "DAPO dynamic sampling: drop groups whose metric is the same for every trajectory and draw more prompts until train_batch_size groups remain",
            ),
          metric: z
            .enum(["acc", "score", "seq_reward", "seq_final_reward"])
            .default("acc")
            .describe(
              "what must vary within a group: acc (exact match), score (the reward), seq_reward (score with the overlong penalty), seq_final_reward (the same; refused with use_kl_in_reward)",
            ),
          max_num_gen_batches: z
            .number()
            .int()
            .default(0)
            .describe(
              "most generation batches (of train_batch_size prompts) per step, the run stops past it; 0 or less = no limit",
            ),
        })
        .prefault({}),
    })
    .prefault({}),
  model: modelSection.extend(loraFields),
  data: z
    .strictObject({
      train_files: z
        .array(z.string().min(1))
        .min(1)
        .default(["data/nq_hotpotqa/train.parquet"])
        .describe("training parquet files (searchr1 preprocess output)"),
      val_files: z
        .array(z.string().min(1))
        .default(["data/nq_hotpotqa/test.parquet"])
        .describe("validation parquet files"),
      train_batch_size: positiveInt().default(512).describe("prompts per step"),
      val_batch_size: positiveInt().default(256).describe("validation questions in flight at once"),
      val_max_samples: positiveInt()
        .nullable()
        .default(null)
        .describe("first validation questions of each data source; null = all"),
      ...lengthFields,
      shuffle: z.boolean().default(true).describe("shuffle training prompts each epoch"),
      seed: z.number().int().default(1).describe("data order and sampling seed"),
    })
    .prefault({}),
  actor: z
    .strictObject({
      lr: z.number().positive().default(1e-6).describe("policy learning rate"),
      lr_warmup_steps_ratio: z
        .number()
        .min(0)
        .max(1)
        .default(0.285)
        .describe("linear warmup over this fraction of the training steps"),
      lr_scheduler: z
        .enum(["constant", "cosine"])
        .default("constant")
        .describe("after the linear warmup: constant, or cosine decay to 0"),
      weight_decay: z.number().min(0).default(0.01).describe("AdamW decoupled weight decay"),
      betas: z.tuple([z.number(), z.number()]).default([0.9, 0.999]).describe("AdamW betas"),
      grad_clip: z.number().positive().default(1).describe("global gradient-norm clip"),
      ppo_mini_batch_size: positiveInt()
        .default(256)
        .describe(
          "per optimizer step, over all ranks: prompts × rollout.n trajectories (verl's meaning; with rollout.n_agent, Search-R1's: trajectories)",
        ),
      ppo_micro_batch_size: positiveInt()
        .nullable()
        .default(64)
        .describe(
          "trajectories per forward/backward over all ranks, divided by the data-parallel size (verl's global size; refused when it does not divide)",
        ),
      ppo_micro_batch_size_per_gpu: positiveInt()
        .nullable()
        .default(null)
        .describe(
          "trajectories per forward/backward on each rank, taken as given; null = ppo_micro_batch_size ÷ ranks",
        ),
      use_dynamic_bsz: z
        .boolean()
        .default(false)
        .describe(
          "cut each rank's micro-batches by ppo_max_token_len_per_gpu real tokens instead of a count of trajectories (verl's use_dynamic_bsz)",
        ),
      ppo_max_token_len_per_gpu: positiveInt()
        .default(16384)
        .describe("use_dynamic_bsz: real tokens per micro-batch on each rank"),
      ppo_epochs: positiveInt().default(1).describe("passes over each batch"),
      clip_ratio: z.number().positive().default(0.2).describe("PPO ratio clip ε"),
      clip_ratio_low: z
        .number()
        .min(0)
        .lt(1)
        .nullable()
        .default(null)
        .describe("ε_low: the ratio's lower clip is 1 − this; null = clip_ratio"),
      clip_ratio_high: z
        .number()
        .min(0)
        .nullable()
        .default(null)
        .describe(
          "ε_high: the ratio's upper clip is 1 + this (DAPO clip-higher: 0.28); null = clip_ratio",
        ),
      entropy_coeff: z.number().min(0).default(0.001).describe("entropy bonus coefficient"),
      use_kl_loss: z.boolean().default(true).describe("KL(π‖ref) term in the actor loss"),
      kl_loss_type: klType.default("low_var_kl").describe("KL estimator (low_var_kl = k3)"),
      kl_loss_coef: z.number().min(0).default(0.001).describe("coefficient of the KL loss"),
      loss_agg_mode: z
        .enum(["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
        .default("token-mean")
        .describe("how token losses are averaged"),
      state_masking: z
        .boolean()
        .default(true)
        .describe("exclude retrieved/observation tokens from the policy loss"),
      gradient_checkpointing: z
        .boolean()
        .default(true)
        .describe(
          "keep only each layer's input in the actor's backward and recompute the rest (less memory, ~1/3 more compute)",
        ),
      ...offloadFields("the actor's", "the policy's"),
    })
    .prefault({}),
  ref: z
    .strictObject({
      ...logProbBatchFields("the reference log-probs", {
        micro: "rollout.log_prob_micro_batch_size",
        dynamic: "rollout.log_prob_use_dynamic_bsz",
        tokens: "rollout.log_prob_max_token_len_per_gpu",
      }),
      param_offload: z
        .boolean()
        .default(false)
        .describe(
          "verl's ref.fsdp_config.param_offload: the reference policy's weights wait in host memory and come to the device only for its log-probs (a copy back of its bf16 weights each step), leaving the device to the updates and the rollouts",
        ),
    })
    .prefault({}),
  critic: z
    .strictObject({
      model_path: z.string().min(1).nullable().default(null).describe("null = model.path"),
      lr: z.number().positive().default(1e-5).describe("critic learning rate"),
      lr_warmup_steps_ratio: z
        .number()
        .min(0)
        .max(1)
        .default(0.015)
        .describe("critic warmup fraction"),
      ppo_mini_batch_size: positiveInt()
        .nullable()
        .default(null)
        .describe("the critic's actor.ppo_mini_batch_size; null = the actor's"),
      ppo_micro_batch_size: positiveInt()
        .nullable()
        .default(8)
        .describe(
          "critic trajectories per forward/backward over all ranks, divided by the data-parallel size",
        ),
      ppo_micro_batch_size_per_gpu: positiveInt()
        .nullable()
        .default(null)
        .describe(
          "critic trajectories per forward/backward on each rank; null = ppo_micro_batch_size ÷ ranks",
        ),
      use_dynamic_bsz: z
        .boolean()
        .nullable()
        .default(null)
        .describe(
          "the critic's micro-batches by tokens: ppo_max_token_len_per_gpu for updates, forward_max_token_len_per_gpu for values; null = actor.use_dynamic_bsz",
        ),
      ppo_max_token_len_per_gpu: positiveInt()
        .default(32768)
        .describe("critic use_dynamic_bsz: real tokens per update micro-batch on each rank"),
      forward_max_token_len_per_gpu: positiveInt()
        .nullable()
        .default(null)
        .describe(
          "critic use_dynamic_bsz: real tokens per values pass on each rank; null = ppo_max_token_len_per_gpu",
        ),
      cliprange_value: z.number().positive().default(0.5).describe("value clip"),
      grad_clip: z.number().positive().default(1).describe("critic gradient-norm clip"),
      weight_decay: z.number().min(0).default(0.01).describe("critic weight decay"),
      ...offloadFields("the critic's", "the critic's"),
      // verl's critic.model.lora_* (verl/trainer/config/critic/dp_critic.yaml).
      lora_rank: loraRankField(
        "the critic's LoRA rank r (verl's critic.model.lora_rank): > 0 trains adapters on the frozen critic and its value head in full beside them (PEFT's TOKEN_CLS task, modules_to_save score; checkpoints hold the critic_adapter folder); 0 = the critic fully fine-tuned. CPU-tested; its CUDA path has not yet run on a GPU",
      ),
      lora_alpha: z
        .number()
        .positive()
        .default(16)
        .describe("the critic adapters' alpha: their output is scaled by lora_alpha / r"),
      target_modules: targetModulesField("the critic's"),
    })
    .prefault({}),
  rollout: z
    .strictObject({
      n: positiveInt()
        .default(5)
        .describe(
          "trajectories sampled per prompt (verl's rollout.n): one GRPO group, and actor.ppo_mini_batch_size counts prompts × n",
        ),
      n_agent: positiveInt()
        .default(1)
        .describe(
          "Search-R1's rollout.n_agent: each prompt repeated n_agent times before the rollouts (the group is n × n_agent), and actor.ppo_mini_batch_size counts trajectories",
        ),
      ...logProbBatchFields("the old log-probs", null),
      free_cache_engine: z
        .boolean()
        .default(true)
        .describe(
          "verl's free_cache_engine: the native engine(s) started for the run give their KV cache's memory back while the trainer works (after the rollouts; SGLang's release_memory_occupation) and take it again once the new weights are in, so a trainer on the same GPU can use it; no effect with engine_url",
        ),
      ...generationFields,
    })
    .prefault({}),
  retriever: retrieverSection
    .extend({
      index: z
        .string()
        .min(1)
        .nullable()
        .default(null)
        .describe(
          "start serve-retriever on this index (BM25 folder, or faiss file with kind e5/bge) instead of using retriever.url",
        ),
      kind: z
        .enum(["bm25", "e5", "bge"])
        .default("bm25")
        .describe("retriever.index's kind (serve-retriever --retriever)"),
      model: z
        .string()
        .min(1)
        .nullable()
        .default(null)
        .describe("dense encoder folder for retriever.index (serve-retriever --retriever-model)"),
      corpus: z
        .string()
        .min(1)
        .nullable()
        .default(null)
        .describe("the corpus jsonl of retriever.index"),
    })
    .prefault({}),
  reward: z
    .strictObject({
      format_reward: z
        .boolean()
        .default(false)
        .describe("Search-R1 v0.3 format reward on top of exact match"),
      structure_format_score: z
        .number()
        .min(0)
        .max(1)
        .default(0.2)
        .describe("format reward: valid structure"),
      final_format_score: z
        .number()
        .min(0)
        .max(1)
        .default(0.1)
        .describe("format reward: invalid structure"),
      retrieval_score: z
        .number()
        .min(0)
        .max(1)
        .default(0)
        .describe("format reward: gold answer retrieved"),
      search_r1_extract: z
        .boolean()
        .default(false)
        .describe(
          "score prompt + response as Search-R1 does, quirks included (a reply with no answer takes the prompt's example 'Beijing'); false = the response's last answer tag, format of the response alone",
        ),
      // DAPO's soft overlong punishment, as verl's reward_model.overlong_buffer.
      overlong_buffer: z
        .strictObject({
          enable: z
            .boolean()
            .default(false)
            .describe(
              "DAPO overlong shaping: add a penalty when a turn's generated tokens run into the last `len` of data.max_response_length",
            ),
          len: positiveInt()
            .default(100)
            .describe(
              "the buffer: penalty 0 up to max_response_length − len tokens, then linear to −penalty_factor at max_response_length",
            ),
          penalty_factor: z
            .number()
            .min(0)
            .default(1)
            .describe("the penalty at the limit (DAPO: 1)"),
        })
        .prefault({}),
    })
    .prefault({}),
  trainer: z
    .strictObject({
      gpus: positiveInt()
        .default(1)
        .describe(
          "GPUs per node (verl's n_gpus_per_node): one data-parallel trainer rank and one native engine replica each, rank r and replica r on device r (CUDA_VISIBLE_DEVICES; NCCL) or all on the CPU (Gloo; sharing trainer.threads and rollout.engine_threads); more than 1 on GPUs is built but has not yet run on a GPU",
        ),
      nnodes: positiveInt()
        .default(1)
        .describe(
          "nodes of the run (torchrun's --nnodes): start `searchr1 train` on each with the same config and its trainer.node_rank; node 0 runs the controller (rollouts, rewards, the retriever) and every node trainer.gpus trainer ranks and engine replicas; the run folder must be on a filesystem every node mounts",
        ),
      node_rank: z
        .number()
        .int()
        .min(0)
        .default(0)
        .describe(
          "this node's rank, 0 to nnodes − 1 (torchrun's --node-rank): 0 is the controller, the others serve its ranks and replicas",
        ),
      master_addr: z
        .string()
        .min(1)
        .nullable()
        .default(null)
        .describe(
          "node 0's address, HOST or HOST:PORT (torchrun's --master-addr), which every node reaches; required with nnodes > 1",
        ),
      master_port: z
        .number()
        .int()
        .min(1)
        .max(65535)
        .default(29500)
        .describe(
          "the port node 0 listens on for the other nodes when master_addr names none (torchrun's --master-port)",
        ),
      join_timeout_s: z
        .number()
        .positive()
        .default(900)
        .describe(
          "seconds node 0 waits for the other nodes to join, and they keep trying to reach it (torchrun's rendezvous timeout)",
        ),
      device: z
        .enum(["auto", "cpu", "cuda"])
        .default("auto")
        .describe(
          "device of the native trainer (auto: CUDA when usable; with gpus > 1, when usable on every rank's device, else the CPU)",
        ),
      threads: threadsField("CPU threads of the native trainer"),
      zero_stage: z
        .number()
        .int()
        .min(0)
        .max(2)
        .nullable()
        .default(null)
        .describe(
          "ZeRO stage of the trainer ranks (DeepSpeed's): 0 = every rank holds its learners' whole state; 1 = the fp32 master weights and AdamW moments sharded over the ranks, the gradient all-reduced once per optimizer step; 2 = the gradients too, each backward pass reduced region by region onto the ranks' shards (a shard and two buckets held during updates, none between; the gradient moves once per micro-batch); null = 0 on one rank, 2 on several (with LoRA, model.lora_rank, 0 but for PPO's fully trained critic: the adapters' state is small; 1 and 2 shard it, the frozen base staying whole)",
        ),
      dry_run: z
        .boolean()
        .default(false)
        .describe(
          "print the memory plan of one device (trainer rank and engine replica: weights, optimizer state, gradients, activations, KV cache) and whether it fits trainer.device_memory_gib, then exit; starts and writes nothing",
        ),
      device_memory_gib: z
        .number()
        .positive()
        .default(79)
        .describe(
          "memory of one device that dry_run's plan is checked against, GiB (an 80 GB A100/H100 shows CUDA about 79)",
        ),
      total_epochs: positiveInt().default(15).describe("epochs when total_training_steps is null"),
      total_training_steps: positiveInt()
        .nullable()
        .default(1005)
        .describe("null = epochs × batches per epoch"),
      save_freq: positiveInt().default(100).describe("steps between checkpoints"),
      test_freq: positiveInt().default(100).describe("steps between validations"),
      val_before_train: z.boolean().default(true).describe("validate once before the first step"),
      val_only: z
        .boolean()
        .default(false)
        .describe("validate once and exit without training (verl's trainer.val_only)"),
      project_name: z.string().min(1).default("searchr1").describe("run group name"),
      experiment_name: z.string().min(1).default("nq_hotpotqa-grpo").describe("run name"),
      output_dir: z
        .string()
        .min(1)
        .default("checkpoints")
        .describe("checkpoints and metrics go under <output_dir>/<project>/<experiment>"),
      default_local_dir: z
        .string()
        .min(1)
        .nullable()
        .default(null)
        .describe(
          "the run folder itself (verl's trainer.default_local_dir); null = <output_dir>/<project>/<experiment>",
        ),
      resume: z
        .union([z.enum(["auto", "disable"]), z.string().min(1)])
        .default("auto")
        .describe("auto (latest checkpoint if any), disable, or a checkpoint folder"),
      stop_on_nan: z
        .boolean()
        .default(true)
        .describe(
          "stop the run (exit 1) at a step with a NaN or ±Inf metric, without checkpointing that step; false = warn and go on",
        ),
      profile: z
        .boolean()
        .default(false)
        .describe(
          "time every backend operation of the trainer ranks on the device (CUDA events on a GPU) and write each step's times per rank to <run>/profile.jsonl; slows the updates a little",
        ),
      ...loggingFields,
    })
    .prefault({}),
});

export type TrainConfig = z.infer<typeof trainSchema>;

export const trainSpec: CommandConfigSpec<typeof trainSchema> = {
  command: "train",
  schema: trainSchema,
  compat: modelCompat,
  verl: {},
  env: {
    ...agentEnv,
    SEARCHR1_OUTPUT_DIR: "trainer.output_dir",
    // torchrun's variables, and SLURM's inside an allocation (templates/slurm/).
    MASTER_ADDR: "trainer.master_addr",
    MASTER_PORT: "trainer.master_port",
    SLURM_NNODES: "trainer.nnodes",
    SLURM_NODEID: "trainer.node_rank",
  },
};
