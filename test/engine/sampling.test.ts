import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chiSquare, gammaQ } from "./chi-square.js";
import {
  fixture,
  generate,
  generateOk,
  modelDir,
  type Output,
  type RunningEngine,
  startEngine,
} from "./helpers.js";

/**
 * Sampling on tiny-vocab (16 tokens) against make_fixtures.py's reference distributions
 * (SGLang's rule: temperature, then top-k, top-p on the sorted cumulative mass, min-p
 * relative to the top probability, renormalised). Thousands of one-token samples per
 * setting from one request with n and a fixed seed: deterministic, so the test is either
 * always right or always wrong, never flaky.
 */

interface Setting {
  name: string;
  temperature: number;
  top_k: number;
  top_p: number;
  min_p: number;
  /** The reference distribution after truncation and renormalisation. */
  probs: number[];
  /** log_softmax(logits / T): what the engine reports for the sampled token. */
  logprobs: number[];
  kept: number;
}

const ref = fixture<{
  model: "tiny-vocab";
  prompt_ids: number[];
  logits: number[];
  settings: Setting[];
}>("sampling.json");
const SAMPLES = 4000;
const SEED = 20250;
/** A setting passes when its counts are this likely or more under the reference. */
const P_MIN = 1e-3;

let server: RunningEngine;

beforeAll(async () => {
  server = await startEngine(["--model", modelDir(ref.model)]);
}, 60_000);

afterAll(async () => {
  if (server) expect((await server.stop()).code).toBe(0);
});

function softmax(logits: readonly number[], t: number): number[] {
  const m = Math.max(...logits);
  const e = logits.map((x) => Math.exp((x - m) / t));
  const s = e.reduce((a, b) => a + b, 0);
  return e.map((x) => x / s);
}

/** One token per sample, n = SAMPLES from one request. */
async function sample(setting: Setting, seed = SEED): Promise<Output[]> {
  return generateOk<Output[]>(server.base, {
    input_ids: ref.prompt_ids,
    sampling_params: {
      temperature: setting.temperature,
      top_k: setting.top_k,
      top_p: setting.top_p,
      min_p: setting.min_p,
      max_new_tokens: 1,
      n: SAMPLES,
      seed,
    },
    return_logprob: true,
  });
}

describe("the chi-square helper", () => {
  it("gives the textbook tail probabilities", () => {
    // chi2.sf(3.841, 1) = 0.05, chi2.sf(23.209, 10) = 0.01, chi2.sf(10, 10) = 0.4405.
    expect(gammaQ(0.5, 3.841459 / 2)).toBeCloseTo(0.05, 5);
    expect(gammaQ(5, 23.209251 / 2)).toBeCloseTo(0.01, 5);
    expect(gammaQ(5, 5)).toBeCloseTo(0.440493, 5);
  });
});

describe("sampling matches the reference distributions (tiny-vocab)", () => {
  it.each(ref.settings.map((s) => [s.name, s]))(
    "%s: chi-square over %#, no token outside the kept set, log-probs unprocessed",
    async (_, setting) => {
      const outs = await sample(setting);
      expect(outs).toHaveLength(SAMPLES);
      const counts = new Array(setting.probs.length).fill(0);
      for (const out of outs) {
        expect(out.output_ids).toHaveLength(1);
        const id = out.output_ids[0] as number;
        counts[id]++;
        const lp = out.meta_info.output_token_logprobs?.[0]?.[0] as number;
        expect(Math.abs(lp - (setting.logprobs[id] as number))).toBeLessThan(1e-4);
      }
      // Tokens that top-k / top-p / min-p remove never come out.
      setting.probs.forEach((p, id) => {
        if (p === 0) expect(counts[id], `token ${id} should have been cut`).toBe(0);
      });
      const fit = chiSquare(counts, setting.probs);
      expect(fit.df).toBe(setting.kept - 1);
      expect(fit.pValue, `chi2 ${fit.statistic.toFixed(1)} on ${fit.df} df`).toBeGreaterThan(P_MIN);
      // The test has the power to see a wrong rule: the same counts reject the
      // untruncated distribution, and truncation without renormalising (the mass cut off
      // going to the last kept token, as a cumulative-sum sampler over raw probabilities
      // does).
      const plain = softmax(ref.logits, setting.temperature);
      if (setting.kept < setting.probs.length) {
        expect(chiSquare(counts, plain).pValue).toBeLessThan(1e-6);
        const unnormalised = plain.map((p, i) => (setting.probs[i] === 0 ? 0 : p));
        const last = unnormalised.reduce(
          (best, p, i) => (p > 0 && p < (unnormalised[best] as number) ? i : best),
          unnormalised.findIndex((p) => p > 0),
        );
        unnormalised[last] =
          (unnormalised[last] as number) + 1 - unnormalised.reduce((a, b) => a + b, 0);
        expect(chiSquare(counts, unnormalised).pValue).toBeLessThan(1e-6);
      } else if (setting.temperature !== 1) {
        // Temperature ignored: the T = 1 distribution is rejected.
        expect(chiSquare(counts, softmax(ref.logits, 1)).pValue).toBeLessThan(1e-6);
      }
    },
    60_000,
  );
});

describe("seeds", () => {
  const params = { temperature: 1, max_new_tokens: 12, ignore_eos: true };

  it("the same seed gives the same tokens alone, inside a busy batch, and as sample i of n (seed + i)", async () => {
    const alone = await generateOk<Output>(server.base, {
      input_ids: ref.prompt_ids,
      sampling_params: { ...params, seed: 77 },
    });
    const others = [
      [3, 4, 5],
      [1, 13],
      [9, 9, 9, 9, 9, 9],
    ];
    // Other requests running at the same time, with and without seeds.
    const noise = Promise.all(
      others.map((ids, i) =>
        generateOk(server.base, {
          input_ids: ids,
          sampling_params: { ...params, n: 40, seed: i === 0 ? null : 1000 + i },
        }),
      ),
    );
    const batch = await generateOk<Output[]>(server.base, {
      input_ids: [...others, ref.prompt_ids, ref.prompt_ids],
      sampling_params: [
        { ...params, n: 8 },
        { ...params, seed: 5 },
        { ...params, top_k: 3 },
        { ...params, seed: 77 },
        { ...params, seed: 70, n: 8 },
      ],
    });
    await noise;
    expect(batch[10]?.output_ids).toEqual(alone.output_ids);
    // Sample 7 of n with seed 70 uses seed 77.
    expect(batch[18]?.output_ids).toEqual(alone.output_ids);
    expect(new Set(batch.slice(11, 19).map((o) => o.output_ids.join())).size).toBeGreaterThan(1);
  });

  it("without a seed, samples differ", async () => {
    const outs = await generateOk<Output[]>(server.base, {
      input_ids: ref.prompt_ids,
      sampling_params: { ...params, n: 16 },
    });
    expect(new Set(outs.map((o) => o.output_ids.join())).size).toBeGreaterThan(8);
  });

  it("temperature 0 is greedy whatever the seed: the top token of the reference logits", async () => {
    const top = ref.logits.indexOf(Math.max(...ref.logits));
    const r = await generate(server.base, {
      input_ids: ref.prompt_ids,
      sampling_params: { temperature: 0, max_new_tokens: 1, n: 5, seed: 3 },
      return_logprob: true,
    });
    expect(r.status).toBe(200);
    for (const out of r.json as Output[]) expect(out.output_ids).toEqual([top]);
  });
});
