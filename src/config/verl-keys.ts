/**
 * The keys of verl's and Search-R1's training configs, as their scripts write them, and what
 * each one is here. Sources: Search-R1 verl/trainer/config/ppo_trainer.yaml and its scripts
 * (scripts/nq_hotpotqa/v0.2/train_{grpo,ppo}.sh, v0.3/train_{grpo,ppo}_format.sh, evaluate.sh);
 * verl verl/trainer/config/ppo_trainer.yaml (the `*_per_gpu` and dynamic-batch names, the KL
 * controller, use_kl_in_reward). `searchr1 config train --reference` prints this table.
 *
 * A key is one of:
 * - `to`: the same meaning under this project's key (a value may be renamed on the way);
 * - `noEffect`: accepted so that the scripts run, warned about once: it changes nothing here;
 * - `only`: honoured at the listed values, which are what searchr1 does anyway (accepted
 *   silently); any other value is refused naming the key.
 */
export type VerlKey =
  | {
      to: string;
      value?: (v: unknown) => unknown;
      /** Other keys the value implies (e.g. the format reward's scores turn it on). */
      also?: Record<string, unknown>;
    }
  | { noEffect: string }
  | { only: readonly unknown[]; why: string };

const FSDP = "searchr1's trainer is not FSDP: data-parallel ranks with ZeRO (trainer.zero_stage)";
const PACKED = "the native trainer always packs sequences without padding";
const ENGINE_BUILT_IN =
  "the native engine generates (rollout.engine and rollout.engine_url pick an SGLang or vLLM server)";
const RUNTIME_FILLED = "filled in by verl at run time";
const SP = "no sequence parallelism: 1 is the only size";

/** verl's names for the advantage estimators → algorithm.name. */
const ESTIMATORS: Record<string, string> = {
  gae: "ppo",
  grpo: "grpo",
  reinforce_plus_plus: "reinforce_plus_plus",
  rloo: "rloo",
};

function estimator(v: unknown): unknown {
  return typeof v === "string" ? (ESTIMATORS[v] ?? v) : v;
}

/** A fsdp_config section: the offloads and the wrapping, for one learner. */
function fsdpConfig(prefix: string, learner: "actor" | "critic" | "ref"): Record<string, VerlKey> {
  const keys: Record<string, VerlKey> = {
    [`${prefix}.wrap_policy.*`]: { noEffect: FSDP },
    [`${prefix}.fsdp_size`]: { noEffect: FSDP },
  };
  const offloads =
    learner === "ref" ? ["param_offload"] : ["param_offload", "grad_offload", "optimizer_offload"];
  for (const what of offloads) keys[`${prefix}.${what}`] = { to: `${learner}.${what}` };
  return keys;
}

/** The micro-batching keys of a log-prob pass (rollout.* or ref.*). */
function logProbKeys(from: string, to: string): Record<string, VerlKey> {
  return Object.fromEntries(
    [
      "log_prob_micro_batch_size",
      "log_prob_micro_batch_size_per_gpu",
      "log_prob_use_dynamic_bsz",
      "log_prob_max_token_len_per_gpu",
    ].map((k) => [`${from}.${k}`, { to: `${to}.${k}` }]),
  );
}

/** An optimizer section (actor or critic). */
function optimKeys(from: string, to: "actor" | "critic"): Record<string, VerlKey> {
  return {
    [`${from}.lr`]: { to: `${to}.lr` },
    [`${from}.lr_warmup_steps_ratio`]: { to: `${to}.lr_warmup_steps_ratio` },
    [`${from}.weight_decay`]: { to: `${to}.weight_decay` },
    [`${from}.betas`]: { to: "actor.betas" },
    [`${from}.warmup_style`]:
      to === "actor"
        ? { to: "actor.lr_scheduler" }
        : { only: ["constant"], why: "the critic's learning rate is constant after its warmup" },
    [`${from}.lr_scheduler_type`]:
      to === "actor"
        ? { to: "actor.lr_scheduler" }
        : { only: ["constant"], why: "the critic's learning rate is constant after its warmup" },
    [`${from}.min_lr_ratio`]: {
      only: [null, 0, 0.0],
      why: "the cosine schedule decays to 0",
    },
    [`${from}.lr_warmup_steps`]: {
      only: [null, -1],
      why: "the warmup is lr_warmup_steps_ratio of the steps",
    },
    [`${from}.total_training_steps`]: { noEffect: RUNTIME_FILLED },
  };
}

export const VERL_KEYS: Readonly<Record<string, VerlKey>> = {
  // data
  "data.tokenizer": { to: "model.tokenizer_path" },
  "data.prompt_key": { only: ["prompt"], why: "the training parquet's prompt column" },
  "data.train_data_num": { only: [null], why: "the whole training set is used" },
  "data.val_data_num": {
    only: [null],
    why: "the whole validation set is used, or data.val_max_samples of each data source",
  },
  "data.shuffle_train_dataloader": { to: "data.shuffle" },
  "data.return_raw_input_ids": { noEffect: "the prompts are tokenized by the controller" },
  "data.return_raw_chat": { noEffect: "the prompts are tokenized by the controller" },
  "data.truncation": { only: ["error", "left"], why: "long prompts are left-truncated" },
  "data.filter_overlong_prompts": { noEffect: "prompts are left-truncated to max_start_length" },

  // actor_rollout_ref.model
  "actor_rollout_ref.hybrid_engine": { only: [true], why: "the engine and trainer share devices" },
  "actor_rollout_ref.model.path": { to: "model.path" },
  "actor_rollout_ref.model.external_lib": { only: [null], why: "models load from their folder" },
  "actor_rollout_ref.model.override_config.*": {
    noEffect: "the model's config.json is used as is",
  },
  "actor_rollout_ref.model.enable_gradient_checkpointing": { to: "actor.gradient_checkpointing" },
  "actor_rollout_ref.model.use_remove_padding": { noEffect: PACKED },
  "actor_rollout_ref.model.trust_remote_code": { noEffect: "no remote code is run" },
  // LoRA (verl/trainer/config/model/hf_model.yaml)
  ...Object.fromEntries(
    ["lora_rank", "lora_alpha", "target_modules", "exclude_modules", "lora_adapter_path"].map(
      (k) => [`actor_rollout_ref.model.${k}`, { to: `model.${k}` }],
    ),
  ),
  "actor_rollout_ref.model.use_shm": { noEffect: "models and adapters load from their folders" },
  "actor_rollout_ref.rollout.layered_summon": {
    noEffect:
      "with LoRA the trainer hands the engine the adapter alone each step, no gathered weights",
  },

  // actor_rollout_ref.actor
  "actor_rollout_ref.actor.strategy": { noEffect: FSDP },
  ...Object.fromEntries(
    [
      "ppo_mini_batch_size",
      "ppo_micro_batch_size",
      "ppo_micro_batch_size_per_gpu",
      "use_dynamic_bsz",
      "ppo_max_token_len_per_gpu",
      "grad_clip",
      "state_masking",
      "clip_ratio",
      "clip_ratio_low",
      "clip_ratio_high",
      "entropy_coeff",
      "use_kl_loss",
      "kl_loss_coef",
      "kl_loss_type",
      "ppo_epochs",
      "loss_agg_mode",
    ].map((k) => [`actor_rollout_ref.actor.${k}`, { to: `actor.${k}` }]),
  ),
  "actor_rollout_ref.actor.clip_ratio_c": { only: [3, 3.0], why: "dual-clip PPO's c is 3" },
  "actor_rollout_ref.actor.shuffle": { noEffect: "the mini-batches are always shuffled, seeded" },
  "actor_rollout_ref.actor.ulysses_sequence_parallel_size": { only: [1], why: SP },
  ...optimKeys("actor_rollout_ref.actor.optim", "actor"),
  ...fsdpConfig("actor_rollout_ref.actor.fsdp_config", "actor"),

  // actor_rollout_ref.ref
  ...fsdpConfig("actor_rollout_ref.ref.fsdp_config", "ref"),
  ...logProbKeys("actor_rollout_ref.ref", "ref"),
  "actor_rollout_ref.ref.ulysses_sequence_parallel_size": { only: [1], why: SP },

  // actor_rollout_ref.rollout
  "actor_rollout_ref.rollout.name": { noEffect: ENGINE_BUILT_IN },
  "actor_rollout_ref.rollout.mode": { noEffect: ENGINE_BUILT_IN },
  ...Object.fromEntries(
    [
      "temperature",
      "top_k",
      "top_p",
      "gpu_memory_utilization",
      "enforce_eager",
      "free_cache_engine",
      "n",
      "n_agent",
    ].map((k) => [`actor_rollout_ref.rollout.${k}`, { to: `rollout.${k}` }]),
  ),
  ...logProbKeys("actor_rollout_ref.rollout", "rollout"),
  // verl's tool agent (verl/trainer/config/rollout/rollout.yaml, multi_turn): the Hermes format.
  "actor_rollout_ref.rollout.multi_turn.enable": {
    noEffect: "the agent is always multi-turn; rollout.multi_turn.format picks tags or tool calls",
  },
  "actor_rollout_ref.rollout.multi_turn.format": { to: "rollout.multi_turn.format" },
  // A tool config means tool calls: verl's format defaults to hermes.
  "actor_rollout_ref.rollout.multi_turn.tool_config_path": {
    to: "rollout.multi_turn.tool_config_path",
    also: { "rollout.multi_turn.format": "hermes" },
  },
  ...Object.fromEntries(
    [
      "max_assistant_turns",
      "max_parallel_calls",
      "max_tool_response_length",
      "tool_response_truncate_side",
    ].map((k) => [`actor_rollout_ref.rollout.multi_turn.${k}`, { to: `rollout.multi_turn.${k}` }]),
  ),
  "actor_rollout_ref.rollout.tensor_model_parallel_size": { to: "rollout.tensor_parallel_size" },
  "actor_rollout_ref.rollout.prompt_length": { noEffect: "data.max_prompt_length decides" },
  "actor_rollout_ref.rollout.response_length": { noEffect: "data.max_response_length decides" },
  "actor_rollout_ref.rollout.dtype": { noEffect: "the engine computes in bf16 on a GPU" },
  "actor_rollout_ref.rollout.ignore_eos": { only: [false], why: "generation stops at EOS" },
  "actor_rollout_ref.rollout.load_format": { noEffect: ENGINE_BUILT_IN },
  "actor_rollout_ref.rollout.max_num_batched_tokens": { noEffect: ENGINE_BUILT_IN },
  "actor_rollout_ref.rollout.max_num_seqs": { noEffect: ENGINE_BUILT_IN },
  "actor_rollout_ref.rollout.max_model_len": { noEffect: "data.max_prompt_length decides" },
  "actor_rollout_ref.rollout.do_sample": {
    only: [true],
    why: "training rollouts sample (rollout.temperature 0 is greedy)",
  },

  // critic
  "critic.strategy": { noEffect: FSDP },
  ...optimKeys("critic.optim", "critic"),
  "critic.model.path": { to: "critic.model_path" },
  "critic.model.tokenizer_path": { noEffect: "the critic reads the actor's token ids" },
  "critic.model.external_lib": { only: [null], why: "models load from their folder" },
  "critic.model.override_config.*": { noEffect: "the model's config.json is used as is" },
  "critic.model.enable_gradient_checkpointing": {
    noEffect: "the critic follows actor.gradient_checkpointing",
  },
  "critic.model.use_remove_padding": { noEffect: PACKED },
  "critic.model.trust_remote_code": { noEffect: "no remote code is run" },
  "critic.model.lora_rank": { to: "critic.lora_rank" },
  "critic.model.lora_alpha": { to: "critic.lora_alpha" },
  "critic.model.target_modules": { to: "critic.target_modules" },
  ...fsdpConfig("critic.model.fsdp_config", "critic"),
  "critic.forward_micro_batch_size": { to: "critic.ppo_micro_batch_size" },
  "critic.forward_micro_batch_size_per_gpu": { to: "critic.ppo_micro_batch_size_per_gpu" },
  "critic.ppo_epochs": {
    noEffect: "the critic takes the actor's epochs (actor.ppo_epochs)",
  },
  "critic.shuffle": { noEffect: "the mini-batches are always shuffled, seeded" },
  "critic.ulysses_sequence_parallel_size": { only: [1], why: SP },

  // reward_model: rule-based rewards only. The format scores are read by Search-R1's
  // main_ppo_format alone, so a script that sets them asks for the format reward.
  "reward_model.enable": { only: [false], why: "rewards are rule-based (exact match, format)" },
  "reward_model.reward_manager": { only: ["naive"], why: "rewards are rule-based" },
  "reward_model.structure_format_score": {
    to: "reward.structure_format_score",
    also: { "reward.format_reward": true },
  },
  "reward_model.final_format_score": {
    to: "reward.final_format_score",
    also: { "reward.format_reward": true },
  },
  "reward_model.retrieval_score": {
    to: "reward.retrieval_score",
    also: { "reward.format_reward": true },
  },

  // algorithm
  "algorithm.adv_estimator": { to: "algorithm.name", value: estimator },
  "algorithm.no_think_rl": { only: [false], why: "Search-R1 raises on it too" },
  "algorithm.kl_ctrl.type": { to: "algorithm.kl_ctrl" },
  "algorithm.kl_ctrl.kl_coef": { to: "algorithm.kl_coef" },
  "algorithm.kl_ctrl.target_kl": { to: "algorithm.target_kl" },
  "algorithm.kl_ctrl.horizon": { to: "algorithm.kl_horizon" },
  "algorithm.state_masking.start_state_marker": {
    only: ["<information>"],
    why: "observations are masked by where the agent inserted them",
  },
  "algorithm.state_masking.end_state_marker": {
    only: ["</information>"],
    why: "observations are masked by where the agent inserted them",
  },

  // trainer
  "trainer.n_gpus_per_node": { to: "trainer.gpus" },
  "trainer.critic_warmup": { only: [0], why: "the actor is updated from the first step" },
  "trainer.default_hdfs_dir": { noEffect: "checkpoints are written to trainer.default_local_dir" },
  "trainer.val_generations_to_log_to_wandb": {
    noEffect: "validation answers are written to <run>/validation/",
  },

  // Search-R1's top-level keys
  max_turns: { to: "rollout.max_turns" },
  do_search: {
    only: [true],
    why: "the agent searches; for the R1 baseline without search preprocess with --template r1-no-search",
  },
};

/** Environment variables of the scripts that change nothing here (warned about when set). */
export const VERL_ENV: Readonly<Record<string, string>> = {
  VLLM_ATTENTION_BACKEND: "the native engine has its own attention kernels",
};

/** The table entry of a dotted key: exact, or a `section.*` entry above it. */
export function verlKey(dotted: string): VerlKey | undefined {
  const exact = VERL_KEYS[dotted];
  if (exact) return exact;
  const parts = dotted.split(".");
  for (let n = parts.length - 1; n > 0; n--) {
    const section = VERL_KEYS[`${parts.slice(0, n).join(".")}.*`];
    if (section) return section;
  }
  return undefined;
}
