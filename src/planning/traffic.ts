/**
 * What one trainer rank sends per training step for its learners' gradients and weights, as
 * `train --dry-run` prints it: volumes in bytes by NCCL's ring accounting, for when each
 * collective runs (native/src/train/learner.h). Times depend on the links, so none are given
 * (docs/multi-gpu.md, "Communication per step", puts numbers on them).
 * - Stages 0 and 1: an all-reduce of the whole fp32 gradient per optimizer step,
 *   2 (N − 1)/N × 4 bytes × floats.
 * - Stage 2: a reduce of each micro-batch pass's gradient, about 4 bytes × floats a pass, as
 *   many passes as the rank's micro-batches: at most ⌈its rows / micro-batch size⌉ (the token
 *   budget may pack more rows into one).
 * - From stage 1 on, the all-gather of the updated weights, (N − 1)/N × the compute copy.
 */
export interface Traffic {
  optimizerSteps: number;
  /** Micro-batch passes of one rank per optimizer step, at most (the largest learner's). */
  passes: number;
  /** Bytes at stage 0 or 1, at stage 2 (at most), and of the weights' all-gathers. */
  allReduce: number;
  reduce: number;
  allGather: number;
}

/** One learner of a run: its padded fp32 buffer and how its updates cut a step's rows. */
export interface LearnerTraffic {
  /** Floats of the flat buffer, padded for the ranks. */
  floats: number;
  /** Bytes per element of the compute copy (2 on CUDA, 4 on the CPU). */
  computeBytes: number;
  /** The rank's rows of one mini-batch, and how many a micro-batch holds. */
  rowsPerRank: number;
  microBatch: number;
}

/** The traffic of `learners` (the actor, and the critic for PPO) over `ranks` ranks. */
export function stepTraffic(
  learners: readonly LearnerTraffic[],
  ranks: number,
  optimizerSteps: number,
): Traffic {
  const share = (ranks - 1) / ranks;
  const t: Traffic = { optimizerSteps, passes: 0, allReduce: 0, reduce: 0, allGather: 0 };
  for (const l of learners) {
    const passes = Math.ceil(l.rowsPerRank / l.microBatch);
    t.passes = Math.max(t.passes, passes);
    t.allReduce += optimizerSteps * 2 * share * 4 * l.floats;
    t.reduce += optimizerSteps * passes * 4 * l.floats;
    t.allGather += optimizerSteps * share * l.computeBytes * l.floats;
  }
  return t;
}

/** The dry run's line. */
export function trafficLine(t: Traffic): string {
  const gb = (bytes: number) =>
    bytes >= 1e12 ? `${(bytes / 1e12).toFixed(2)} TB` : `${(bytes / 1e9).toFixed(1)} GB`;
  return (
    `gradient traffic of one rank per step (collective volumes, ${t.optimizerSteps} optimizer ` +
    `step(s)): stage 0/1 ${gb(t.allReduce)} (an all-reduce per optimizer step); stage 2 up to ` +
    `${gb(t.reduce)} (a reduce per micro-batch pass, up to ${t.passes} per optimizer step); ` +
    `from stage 1 on the all-gather of the updated weights adds ${gb(t.allGather)}`
  );
}
