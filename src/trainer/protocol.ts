// The commands and replies of `searchr1-trainer serve` (native/src/train/SERVE.md), typed.
// Field names are the protocol's own (snake_case): these objects go on the wire as they are,
// so there is no second naming to keep in step. Every optional field may be left out; the
// trainer then uses its default, stated once in SERVE.md (`train` sends its config's values,
// whose defaults are src/config/schemas/train.ts's). The unions list every spelling the
// trainer accepts, aliases included, so nothing it takes is refused here.

/** `actor_optim` / `critic_optim` of `load`. */
export interface OptimFields {
  /** Peak learning rate. */
  lr?: number;
  lr_schedule?: "constant" | "linear-warmup" | "cosine";
  warmup_steps?: number;
  /** Optimizer steps of the whole run; cosine decays over them. */
  total_steps?: number;
  min_lr_ratio?: number;
  beta1?: number;
  beta2?: number;
  eps?: number;
  weight_decay?: number;
  /** Gradient-norm clip; 0 = off. */
  grad_clip?: number;
}

/** How an update cuts its batch: mini-batches (optimizer steps), micro-batches (memory). */
export interface BatchingFields {
  /** Sequences per optimizer step; 0 = the whole batch. */
  ppo_mini_batch_size?: number;
  ppo_epochs?: number;
  /** Real tokens per micro-batch; 0 = the whole mini-batch. */
  ppo_max_token_len_per_gpu?: number;
  /** Shuffle the rows into mini-batches with the learner's seeded generator. */
  shuffle?: boolean;
  /** Drop each micro-batch's padding; same result up to float rounding. */
  remove_padding?: boolean;
}

export type LossAggMode = "token-mean" | "seq-mean-token-sum" | "seq-mean-token-mean";
export type KlLossType = "low_var_kl" | "k3" | "kl" | "k1" | "mse" | "k2" | "abs";
/** export's dtype; matched without regard to case by the trainer. */
export type ExportDtype =
  | "bf16"
  | "bfloat16"
  | "fp16"
  | "float16"
  | "f16"
  | "fp32"
  | "float32"
  | "f32";

export interface LoadFields {
  /** Hugging Face folder of the policy. */
  policy: string;
  /** The frozen reference policy's folder (needed for log_probs with model "reference"). */
  reference?: string;
  /** The reference waits in host memory, on the device only for its log_probs. */
  reference_offload?: boolean;
  /** A critic checkpoint, or a causal LM folder (lm_head dropped, value head starting at 0). */
  critic?: string;
  actor_optim?: OptimFields;
  critic_optim?: OptimFields;
  /** Seeds the learners' shuffling generators. */
  seed?: number;
  /**
   * ZeRO stage of the actor and the critic (SERVE.md, "Several ranks"): 0 every rank holds
   * all of its learner's state; 1 the fp32 masters and AdamW moments are sharded over the
   * ranks; 2 the gradients too (reduce-scattered, none held between updates).
   */
  zero_stage?: 0 | 1 | 2;
  /** What the actor keeps in host memory (SERVE.md, "Offload"); each false when absent. */
  actor_offload?: OffloadFields;
  /** The same for the critic (only with `critic`). */
  critic_offload?: OffloadFields;
  /**
   * LoRA adapters on the policy (SERVE.md, "LoRA"): the base frozen, the reference the policy
   * with its adapters off (no `reference`), checkpoints hold a PEFT folder `adapter`.
   */
  lora?: LoraFields;
  /**
   * LoRA adapters on the critic (only with `critic`): its base frozen, its value head trained
   * in full beside them; checkpoints hold a PEFT TOKEN_CLS folder `critic_adapter`.
   */
  critic_lora?: LoraFields;
}

/** load's `lora`: a fresh adapter (`rank`, ...) or a PEFT folder to start from (`path`). */
export interface LoraFields {
  rank?: number;
  /** Scaling alpha / rank (alpha / sqrt(rank) with use_rslora); 16 when absent. */
  alpha?: number;
  use_rslora?: boolean;
  /** "all-linear" or PEFT's module names (q_proj, ..., down_proj). */
  target_modules?: "all-linear" | string[];
  /** A PEFT adapter folder; the fields given beside it must be its adapter_config.json's. */
  path?: string;
  /** A fresh adapter's generator seed; load's `seed` when absent. */
  seed?: number;
}

/** verl's fsdp_config offloads of one learner (native/src/train/learner.h). */
export interface OffloadFields {
  /** The compute copy waits in host memory between the trainer's commands. */
  param?: boolean;
  /** The fp32 gradient the optimizer step reads lives in host memory. */
  grad?: boolean;
  /** The fp32 masters and AdamW moments live in host memory; the step runs on the host. */
  optimizer?: boolean;
}

export interface LogProbsFields {
  /** Batch file: input_ids, attention_mask. */
  batch: string;
  /** Written with log_probs and entropy, F32 [B, T]. */
  out: string;
  model?: "policy" | "reference";
  temperature?: number;
  /** Sequences per forward pass (each packed into one row); 0 = the whole batch. */
  micro_batch_size?: number;
}

export interface ValuesFields {
  batch: string;
  /** Written with values, F32 [B, T]. */
  out: string;
  /** Sequences per forward pass (each packed into one row); 0 = the whole batch. */
  micro_batch_size?: number;
}

export interface UpdateActorFields extends BatchingFields {
  /**
   * Batch file with response_mask, old_log_probs, advantages (and ref_log_probs for KL;
   * rollout_is_weights for rollout correction, else all 1).
   */
  batch: string;
  clip_ratio?: number;
  clip_ratio_low?: number;
  clip_ratio_high?: number;
  /** Dual-clip bound for negative advantages. */
  clip_ratio_c?: number;
  kl_loss_type?: KlLossType;
  kl_loss_coef?: number;
  entropy_coeff?: number;
  loss_agg_mode?: LossAggMode;
  temperature?: number;
}

export interface UpdateCriticFields extends BatchingFields {
  /** Batch file with response_mask, values (the rollout's), returns. */
  batch: string;
  cliprange_value?: number;
  loss_agg_mode?: LossAggMode;
}

export type ExportFields = (
  | {
      /** Hugging Face folder, replaced once complete (rank 0 writes it). */
      out: string;
    }
  | {
      /** One folder per node, which that node's first rank writes (several nodes). */
      node_outs: string[];
    }
) & {
  dtype?: ExportDtype;
  /** The LoRA adapter alone, as a PEFT folder in fp32 (a LoRA policy only). */
  adapter?: boolean;
};

export interface SaveCheckpointFields {
  dir: string;
  overwrite?: boolean;
}

export interface LoadCheckpointFields {
  dir: string;
}

/** A float the trainer computed; null when it was not finite (JSON has no NaN). */
export type Metric = number | null;

export interface LoadReply {
  parameters: number;
  device: string;
  zero_stage: 0 | 1 | 2;
  /** Bytes this rank holds for each model loaded. */
  memory: {
    actor: LearnerMemory;
    reference?: { weights: number; master_weights: number; host_weights: number };
    critic?: LearnerMemory;
  };
  /** The adapters attached by `lora`. */
  lora?: AdaptersReply;
  /** The critic's, attached by `critic_lora` (`value_head` true). */
  critic_lora?: AdaptersReply;
}

/** What `load` attached: the adapters' settings and the values they train. */
export interface AdaptersReply {
  rank: number;
  alpha: number;
  scaling: number;
  use_rslora: boolean;
  target_modules: string[];
  /** The value head trained in full beside them (a critic's). */
  value_head: boolean;
  /** The adapters' values (and a critic's value head). */
  trainable_parameters: number;
}

/** A learner's bytes on one rank (Learner::Memory in native/src/train/learner.h). */
export interface LearnerMemory {
  /**
   * The compute copy of the whole model on the device (bf16 on CUDA; fp32 on the CPU, the
   * masters); 0 while param offload keeps it in host memory. The fields before the host_ ones
   * are device memory.
   */
  weights: number;
  /** fp32 masters apart from the compute copy: the whole model's, or this rank's shard. */
  master_weights: number;
  /** AdamW's two moments: the whole model's, or this rank's shard. */
  optimizer_state: number;
  /** The fp32 gradient buffer during an update. */
  gradients: number;
  /** ... and between updates (ZeRO stage 2, grad offload: none). */
  gradients_between_updates: number;
  /** Host memory (the offloads): the compute copy between commands (param offload). */
  host_weights: number;
  /** The fp32 masters (optimizer offload). */
  host_master_weights: number;
  /** AdamW's two moments (optimizer offload). */
  host_optimizer_state: number;
  /** The gradient the step reads (grad or optimizer offload). */
  host_gradients: number;
}

/** Means over the update's optimizer steps, the last learning rate and the counts. */
export interface ActorMetrics {
  pg_loss: Metric;
  pg_clipfrac: Metric;
  ppo_kl: Metric;
  entropy: Metric;
  /** null also when the batch had no ref_log_probs (no KL term). */
  kl_loss: Metric;
  grad_norm: Metric;
  lr: Metric;
  /** Loss tokens of the batch: predicted and in response_mask. */
  tokens: number;
  optimizer_steps: number;
  micro_batches: number;
  global_step: number;
}

export interface CriticMetrics {
  vf_loss: Metric;
  vf_clipfrac: Metric;
  vpred_mean: Metric;
  grad_norm: Metric;
  lr: Metric;
  optimizer_steps: number;
  micro_batches: number;
  global_step: number;
}

export interface StepReply {
  global_step: number;
}

/** One kind of backend operation's device time, in a `profile` reply. */
export interface OpTime {
  /** The operation; matmuls with their weight's shape ("matmul_forward 896x1152"). */
  op: string;
  calls: number;
  ms: number;
}

/** `profile`: the device time since the last `profile`, largest first. */
export interface ProfileReply {
  ops: OpTime[];
  device_ms: number;
}

// biome-ignore lint/complexity/noBannedTypes: ops whose reply carries nothing but ok and id
type Empty = {};

/** Each op's fields and reply (besides `op`, `id` and `ok`). */
export interface Ops {
  load: { fields: LoadFields; reply: LoadReply };
  log_probs: { fields: LogProbsFields; reply: Empty };
  values: { fields: ValuesFields; reply: Empty };
  update_actor: { fields: UpdateActorFields; reply: ActorMetrics };
  update_critic: { fields: UpdateCriticFields; reply: CriticMetrics };
  export: { fields: ExportFields; reply: Empty };
  save_checkpoint: { fields: SaveCheckpointFields; reply: StepReply };
  load_checkpoint: { fields: LoadCheckpointFields; reply: StepReply };
  profile: { fields: Empty; reply: ProfileReply };
  shutdown: { fields: Empty; reply: Empty };
}

export type Op = keyof Ops;
