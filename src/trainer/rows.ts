// The trainer's ops on response-aligned rows: each writes its batch file into the trainer's
// scratch folder, calls the op, reads the output back as rows and deletes its files.
//
// Which mask goes where (Search-R1 with state masking: RayPPOTrainer._create_loss_mask in
// verl/trainer/ppo/ray_trainer.py, DataParallelPPOActor.update_policy in
// verl/workers/actor/dp_actor.py, DataParallelPPOCritic in verl/workers/critic/dp_critic.py;
// docs/rl-algorithms.md, "Which tokens count"). The trainer reads
// one mask, `response_mask`, and both learners count a token only where it is predicted and
// that mask is non-zero:
//  - update_actor: response_mask ← the LOSS mask (1 on generated tokens, 0 on <information>
//    blocks and invalid-action messages). The trainer's PPO objective uses it for the clipped
//    policy loss, the entropy and the KL loss: Search-R1's loss_mask (info_mask) in
//    DataParallelPPOActor.update_policy. So `tokens` in the reply is the number of generated tokens.
//  - update_critic: response_mask ← the RESPONSE mask (1 on every response token, observations
//    included): Search-R1's critic masks with the attention mask, like GAE and whitening
//    (src/rl/advantages.ts). Search-R1 shifts that mask with the values (compute_values and
//    update_critic in dp_critic.py take values and attention_mask[:, -L-1:-1]): value
//    j, V(state before response token j), is masked by the attention mask of token j - 1,
//    which counts the same tokens, plus one more in rows shorter than the padded batch: the
//    value of the state after the last token, at the first padding position. The trainer
//    gives no value at padding (not predicted), so that one term per row is left out here.

import { rm } from "node:fs/promises";
import { readResponseRows, type Sequence, type TokenRows, writeBatch } from "./batch.js";
import type {
  ActorMetrics,
  CriticMetrics,
  LogProbsFields,
  UpdateActorFields,
  UpdateCriticFields,
  ValuesFields,
} from "./protocol.js";
import type { Trainer } from "./trainer.js";

export interface LogProbRows {
  logProbs: Float32Array[];
  entropy: Float32Array[];
}

/** The policy's (or the reference's) log-probs and entropies of the response tokens. */
export function logProbRows(
  trainer: Trainer,
  sequences: readonly Sequence[],
  options: Omit<LogProbsFields, "batch" | "out"> = {},
): Promise<LogProbRows> {
  return withFiles(trainer, async (file) => {
    const [batch, out] = [file("inputs"), file("log-probs")];
    await writeBatch(batch, sequences);
    await trainer.logProbs({ ...options, batch, out });
    const rows = await readResponseRows(out, sequences, ["log_probs", "entropy"]);
    return { logProbs: rows.log_probs, entropy: rows.entropy };
  });
}

/** The critic's V(state before response token j), per response token j. */
export function valueRows(
  trainer: Trainer,
  sequences: readonly Sequence[],
  options: Omit<ValuesFields, "batch" | "out"> = {},
): Promise<Float32Array[]> {
  return withFiles(trainer, async (file) => {
    const [batch, out] = [file("inputs"), file("values")];
    await writeBatch(batch, sequences);
    await trainer.values({ ...options, batch, out });
    return (await readResponseRows(out, sequences, ["values"])).values;
  });
}

export interface ActorRows {
  /** 1 on generated tokens, 0 on observation tokens (becomes response_mask). */
  lossMask: TokenRows;
  oldLogProbs: TokenRows;
  advantages: TokenRows;
  /** Needed when kl_loss_coef > 0. */
  refLogProbs?: TokenRows;
  /**
   * Rollout correction's truncated importance weights, multiplied into each token's policy
   * loss (src/rl/rollout-correction.ts); absent: all 1.
   */
  rolloutIsWeights?: TokenRows;
}

/** The actor update on the rollout's rows; the reply's metrics. */
export function updateActorRows(
  trainer: Trainer,
  sequences: readonly Sequence[],
  rows: ActorRows,
  options: Omit<UpdateActorFields, "batch"> = {},
): Promise<ActorMetrics> {
  return withFiles(trainer, async (file) => {
    const batch = file("actor-batch");
    await writeBatch(batch, sequences, {
      response_mask: rows.lossMask,
      old_log_probs: rows.oldLogProbs,
      advantages: rows.advantages,
      ...(rows.refLogProbs ? { ref_log_probs: rows.refLogProbs } : {}),
      ...(rows.rolloutIsWeights ? { rollout_is_weights: rows.rolloutIsWeights } : {}),
    });
    return trainer.updateActor({ ...options, batch });
  });
}

export interface CriticRows {
  /** 1 on every response token, observations included (becomes response_mask). */
  responseMask: TokenRows;
  /** The rollout's values (valueRows before the update). */
  values: TokenRows;
  returns: TokenRows;
}

/** The critic update on the rollout's rows; the reply's metrics. */
export function updateCriticRows(
  trainer: Trainer,
  sequences: readonly Sequence[],
  rows: CriticRows,
  options: Omit<UpdateCriticFields, "batch"> = {},
): Promise<CriticMetrics> {
  return withFiles(trainer, async (file) => {
    const batch = file("critic-batch");
    await writeBatch(batch, sequences, {
      response_mask: rows.responseMask,
      values: rows.values,
      returns: rows.returns,
    });
    return trainer.updateCritic({ ...options, batch });
  });
}

/**
 * Runs `work` with fresh scratch file names and deletes those files afterwards. When the
 * trainer has died meanwhile (its scratch folder goes with it), the death is the error.
 */
async function withFiles<T>(
  trainer: Trainer,
  work: (file: (stem: string) => string) => Promise<T>,
): Promise<T> {
  const files: string[] = [];
  const file = (stem: string) => {
    if (trainer.ended) throw trainer.ended;
    const path = trainer.scratch.file(stem);
    files.push(path);
    return path;
  };
  try {
    return await work(file);
  } catch (err) {
    throw trainer.ended ?? err;
  } finally {
    await Promise.all(files.map((f) => rm(f, { force: true })));
  }
}
