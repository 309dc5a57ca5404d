// Offload (native/src/train/learner.h; SERVE.md, "Offload"): load's actor_offload and
// critic_offload keep a learner's compute copy between commands (param), the gradient its
// step reads (grad), or its fp32 masters and AdamW moments with the step itself (optimizer)
// in host memory. On the CPU backend only where the values live and the copies change, never
// the arithmetic, so each offload, and all three, must give the plain run bit for bit: on one
// rank (stage 0) and on two Gloo ranks at ZeRO stages 1 and 2, for the actor and the critic
// together,
//  - the replies of two update_actor and update_critic each, a checkpoint of them, two more
//    updates, log_probs and values after them and a checkpoint at the end (every file's
//    bytes);
//  - resumed from the first checkpoint with the same offload: the last two updates and the
//    final checkpoint again;
//  - the load reply's memory: what is on the device and what in host memory, as the memory
//    plan has it (`searchr1-trainer plan`, Learner::planned, through
//    src/planning/native-sizes.ts).
// A malformed offload field is refused, naming it.
import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import type { ZeroStage } from "../../src/planning/memory-plan.js";
import { modelBytes, NO_OFFLOAD, type Offload } from "../../src/planning/native-sizes.js";
import {
  FIXTURES,
  get,
  modelDir,
  readFloats,
  rolloutBatch,
  tempDir,
  writeBatchFile,
} from "./helpers.js";
import { Ranks } from "./trainer-ranks.js";

const POLICY = modelDir("untied");
const CRITIC = join(FIXTURES, "critic-untied");

// 8 sequences of different lengths, prompt then response with a hole in every other mask.
const B = 8;
const T = 24;
const advantages = new Float32Array(B * T);
const returns = new Float32Array(B * T);
const { ids, attention, response, tensor } = rolloutBatch({
  T,
  lengths: [24, 9, 17, 12, 21, 7, 15, 19],
  prompts: [4, 3, 5, 3, 6, 2, 4, 3],
  seed: 43,
  holeLength: 2,
  perToken: (b, i, rand) => {
    advantages[i] = (b % 3 === 0 ? -1 : 1) * (0.3 + rand());
    returns[i] = rand() - 0.5;
  },
});

const LOAD = {
  policy: POLICY,
  reference: POLICY,
  critic: CRITIC,
  seed: 7,
  actor_optim: { lr: 1e-3, lr_schedule: "cosine", warmup_steps: 1, total_steps: 12 },
  critic_optim: { lr: 1e-3 },
};
// Two shuffled mini-batches of 4 sequences per update, each rank's rows cut by the budget.
const BATCHING = { ppo_mini_batch_size: 4, ppo_max_token_len_per_gpu: 40 };
const ACTOR = { ...BATCHING, kl_loss_coef: 0.01, entropy_coeff: 0.01 };

interface Topology {
  ranks: number;
  stage: ZeroStage;
}
const TOPOLOGIES: Topology[] = [
  { ranks: 1, stage: 0 },
  { ranks: 2, stage: 1 },
  { ranks: 2, stage: 2 },
];
const ALL: Offload = { param: true, grad: true, optimizer: true };
const OFFLOADS: [string, Offload][] = [
  ["param", { ...NO_OFFLOAD, param: true }],
  ["grad", { ...NO_OFFLOAD, grad: true }],
  ["optimizer", { ...NO_OFFLOAD, optimizer: true }],
  ["all three", ALL],
];

interface Batches {
  inputs: string;
  actor: string;
  critic: string;
}

/** The batch files, from the plain models' log-probs and values. */
async function batches(): Promise<Batches> {
  const r = new Ranks(1);
  await r.ok("load", LOAD);
  const inputs = await writeBatchFile([
    tensor("input_ids", ids),
    tensor("attention_mask", attention),
  ]);
  const out = tempDir();
  await r.ok("log_probs", { batch: inputs, out: join(out, "lp.safetensors") });
  await r.ok("values", { batch: inputs, out: join(out, "v.safetensors") });
  expect(await r.close()).toEqual([0]);
  const lp = get(await readFloats(join(out, "lp.safetensors")), "log_probs");
  const values = get(await readFloats(join(out, "v.safetensors")), "values");
  const old = lp.map((x, i) => x + 0.4 * Math.sin(i)); // off the policy: some ratios clip
  const common = [
    tensor("input_ids", ids),
    tensor("attention_mask", attention),
    tensor("response_mask", response),
  ];
  return {
    inputs,
    actor: await writeBatchFile([
      ...common,
      tensor("old_log_probs", old),
      tensor("ref_log_probs", lp),
      tensor("advantages", advantages),
    ]),
    critic: await writeBatchFile([...common, tensor("values", values), tensor("returns", returns)]),
  };
}

/** Every file under `dir` by its path there. */
function files(dir: string): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  for (const entry of readdirSync(dir, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile()) continue;
    const path = join(entry.parentPath, entry.name);
    out.set(relative(dir, path), readFileSync(path));
  }
  return out;
}

/** Two updates of each learner, then log_probs, values and a checkpoint: their bytes. */
async function continueRun(r: Ranks, b: Batches) {
  const replies = [];
  for (let k = 0; k < 2; k++) {
    replies.push(await r.ok("update_actor", { batch: b.actor, ...ACTOR }));
    replies.push(await r.ok("update_critic", { batch: b.critic, ...BATCHING }));
  }
  const out = tempDir();
  await r.ok("log_probs", { batch: b.inputs, out: join(out, "lp.safetensors") });
  await r.ok("values", { batch: b.inputs, out: join(out, "v.safetensors") });
  const checkpoint = join(out, "end");
  await r.ok("save_checkpoint", { dir: checkpoint });
  return {
    replies,
    logProbs: readFileSync(join(out, "lp.safetensors")),
    values: readFileSync(join(out, "v.safetensors")),
    checkpoint: files(checkpoint),
  };
}

const loadFields = (t: Topology, offload: Offload | null) => ({
  ...LOAD,
  zero_stage: t.stage,
  ...(offload ? { actor_offload: offload, critic_offload: offload } : {}),
});

/** A run of `t` with `offload` on both learners (null: none), and its resumption. */
async function run(t: Topology, offload: Offload | null, b: Batches) {
  const r = new Ranks(t.ranks);
  const loaded = await r.ok("load", loadFields(t, offload));
  const first = await continueRun(r, b);
  const saved = join(tempDir(), "ckpt");
  await r.ok("save_checkpoint", { dir: saved });
  const continued = await continueRun(r, b);
  expect(await r.close()).toEqual(Array(t.ranks).fill(0));
  return { loaded, first, saved, continued };
}

async function resume(t: Topology, offload: Offload | null, from: string, b: Batches) {
  const r = new Ranks(t.ranks);
  await r.ok("load", { ...loadFields(t, offload), seed: 99 });
  await r.ok("load_checkpoint", { dir: from });
  const continued = await continueRun(r, b);
  expect(await r.close()).toEqual(Array(t.ranks).fill(0));
  return continued;
}

type Continued = Awaited<ReturnType<typeof continueRun>>;

function expectSame(got: Continued, want: Continued, what: string) {
  expect(got.replies, `${what}: the update replies`).toStrictEqual(want.replies);
  expect(got.logProbs.equals(want.logProbs), `${what}: log_probs`).toBe(true);
  expect(got.values.equals(want.values), `${what}: values`).toBe(true);
  expect([...got.checkpoint.keys()].sort()).toEqual([...want.checkpoint.keys()].sort());
  for (const [name, bytes] of want.checkpoint) {
    expect(got.checkpoint.get(name)?.equals(bytes), `${what}: ${name}`).toBe(true);
  }
}

/** What the load reply says a learner holds: Learner::Memory as the plan computes it. */
function expectedMemory(model: string, head: "lm" | "value", t: Topology, offload: Offload) {
  const b = modelBytes({ dir: model, head, device: "cpu", ranks: t.ranks, offload, tokens: [] })
    .learner[t.stage];
  return {
    weights: offload.param ? 0 : b.weights, // in host memory right after load
    master_weights: b.masters,
    optimizer_state: b.optimizer,
    gradients: b.gradients,
    gradients_between_updates: b.gradientsBetween,
    host_weights: b.hostWeights,
    host_master_weights: b.hostMasters,
    host_optimizer_state: b.hostOptimizer,
    host_gradients: b.hostGradients,
  };
}

let b: Batches;
beforeAll(async () => {
  b = await batches();
}, 60_000);

describe.each(TOPOLOGIES)("offload on $ranks rank(s) at ZeRO stage $stage", (t) => {
  let plain: Awaited<ReturnType<typeof run>>;
  beforeAll(async () => {
    plain = await run(t, null, b);
  }, 120_000);

  it("without offload: nothing in host memory", () => {
    const memory = plain.loaded.memory as Record<string, unknown>;
    expect(memory.actor).toEqual(expectedMemory(POLICY, "lm", t, NO_OFFLOAD));
    expect(memory.critic).toEqual(expectedMemory(CRITIC, "value", t, NO_OFFLOAD));
    // The run moved the weights.
    expect(plain.continued.logProbs.equals(plain.first.logProbs)).toBe(false);
  });

  it.each(OFFLOADS)(
    "%s: the plain run bit for bit, resumed too; the memory reply says what is where",
    async (_, offload) => {
      const off = await run(t, offload, b);
      expectSame(off.first, plain.first, "the first updates");
      expect(files(off.saved).size).toBe(files(plain.saved).size);
      for (const [name, bytes] of files(plain.saved)) {
        expect(files(off.saved).get(name)?.equals(bytes), `checkpoint ${name}`).toBe(true);
      }
      expectSame(off.continued, plain.continued, "the updates after the checkpoint");
      expectSame(await resume(t, offload, off.saved, b), plain.continued, "resumed");
      const memory = off.loaded.memory as Record<string, unknown>;
      expect(memory.actor).toEqual(expectedMemory(POLICY, "lm", t, offload));
      expect(memory.critic).toEqual(expectedMemory(CRITIC, "value", t, offload));
    },
    180_000,
  );
});

describe("malformed offload fields", () => {
  it("are refused, naming the field", async () => {
    const r = new Ranks(1);
    const p = r.procs[0];
    if (!p) throw new Error("no rank");
    expect(await p.fails("load", { ...LOAD, actor_offload: true })).toBe(
      "'actor_offload' must be an object",
    );
    expect(await p.fails("load", { ...LOAD, actor_offload: { grad: 1 } })).toBe(
      "in 'actor_offload': 'grad' must be true or false",
    );
    expect(await p.fails("load", { ...LOAD, critic_offload: { params: true } })).toBe(
      "in 'critic_offload': unknown field 'params' (known: param, grad, optimizer)",
    );
    expect(await p.fails("load", { policy: POLICY, critic_offload: { param: true } })).toBe(
      "'critic_offload' needs a 'critic' to offload",
    );
    // A refused load leaves nothing loaded; a good one still loads.
    await p.ok("load", { ...LOAD, actor_offload: ALL, critic_offload: {} });
    expect(await r.close()).toEqual([0]);
  });
});
