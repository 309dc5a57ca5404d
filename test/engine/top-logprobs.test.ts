import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  fixture,
  GREEDY,
  type GreedyCase,
  generate,
  generateOk,
  greedy,
  modelDir,
  type Output,
  type RunningEngine,
  startEngine,
} from "./helpers.js";

/**
 * /generate's `top_logprobs_num` (SGLang's meta_info.output_top_logprobs) through the real
 * native engine, against make_fixtures.py's PyTorch references: on tiny-vocab (16 tokens)
 * the whole ranked vocabulary equals log_softmax(logits / T) of the reference logits for
 * every sampling setting of sampling.json (the cut of top-k/top-p/min-p does not change it:
 * the distribution is the sampled token's), and on qwen-bpe the top entries of 24 greedy
 * decode steps start with the reference token and its reference log-prob.
 */

const LOGPROB_TOL = 1e-4;

const sampling = fixture<{
  model: "tiny-vocab";
  prompt_ids: number[];
  logits: number[];
  settings: {
    name: string;
    temperature: number;
    top_k: number;
    top_p: number;
    min_p: number;
    logprobs: number[];
  }[];
}>("sampling.json");

/** [id, logprob] of every token, most likely first, ties by the lower id. */
function ranked(logprobs: readonly number[]): [number, number][] {
  return logprobs
    .map((lp, id): [number, number] => [id, lp])
    .sort((a, b) => b[1] - a[1] || a[0] - b[0]);
}

function logSoftmax(logits: readonly number[]): number[] {
  const m = Math.max(...logits);
  const s = Math.log(logits.reduce((a, x) => a + Math.exp(x - m), 0));
  return logits.map((x) => x - m - s);
}

/** The triples of one token: sorted, ≤ 0, and the sampled token's log-prob where it appears. */
function expectWellFormed(out: Output, k: number): void {
  const tops = out.meta_info.output_top_logprobs as [number, number, null][][];
  const sampled = out.meta_info.output_token_logprobs as [number, number, null][];
  expect(tops).toHaveLength(out.output_ids.length);
  tops.forEach((top, t) => {
    expect(top).toHaveLength(k);
    top.forEach(([lp, id, text], r) => {
      expect(Number.isInteger(id)).toBe(true);
      expect(text).toBeNull();
      expect(lp).toBeLessThanOrEqual(0);
      if (r > 0) expect(lp).toBeLessThanOrEqual((top[r - 1] as [number, number, null])[0]);
    });
    const [lp, id] = sampled[t] as [number, number, null];
    const same = top.find(([, other]) => other === id);
    if (same) expect(same[0]).toBeCloseTo(lp, 6);
    else expect(lp).toBeLessThanOrEqual((top[k - 1] as [number, number, null])[0]);
  });
}

describe("top log-probs on tiny-vocab equal log_softmax(logits / T) of the reference", () => {
  let server: RunningEngine;

  beforeAll(async () => {
    server = await startEngine(["--model", modelDir(sampling.model)]);
  }, 60_000);

  afterAll(async () => {
    if (server) expect((await server.stop()).code).toBe(0);
  });

  const settings = [
    { name: "greedy", temperature: 0, top_k: -1, top_p: 1, min_p: 0, logprobs: [] as number[] },
    ...sampling.settings,
  ];
  it.each(settings)("$name: the whole vocabulary, ranked, with its log-probs", async (s) => {
    const reference = s.temperature === 0 ? logSoftmax(sampling.logits) : s.logprobs;
    const want = ranked(reference);
    const out = await generateOk<Output>(server.base, {
      input_ids: sampling.prompt_ids,
      sampling_params: {
        max_new_tokens: 1,
        temperature: s.temperature,
        top_k: s.top_k,
        top_p: s.top_p,
        min_p: s.min_p,
        seed: 7,
      },
      return_logprob: true,
      top_logprobs_num: 16,
    });
    expectWellFormed(out, 16);
    const top = (out.meta_info.output_top_logprobs as [number, number, null][][])[0] ?? [];
    expect(top.map(([, id]) => id)).toEqual(want.map(([id]) => id));
    top.forEach(([lp], r) => {
      expect(Math.abs(lp - (want[r] as [number, number])[1])).toBeLessThan(LOGPROB_TOL);
    });
    if (s.temperature === 0) expect(out.output_ids[0]).toBe(top[0]?.[1]);
  });

  it("a number above the vocabulary lists all of it; fewer lists the head", async () => {
    const body = (k: number) => ({
      input_ids: sampling.prompt_ids,
      sampling_params: { max_new_tokens: 3, temperature: 0 },
      return_logprob: true,
      top_logprobs_num: k,
    });
    const all = await generateOk<Output>(server.base, body(40));
    expectWellFormed(all, 16);
    const three = await generateOk<Output>(server.base, body(3));
    expectWellFormed(three, 3);
    three.meta_info.output_top_logprobs?.forEach((top, t) => {
      expect(top).toEqual(all.meta_info.output_top_logprobs?.[t]?.slice(0, 3));
    });
  });

  it("a batch asks per input; without top_logprobs_num there is no output_top_logprobs", async () => {
    const outs = await generateOk<Output[]>(server.base, {
      input_ids: [sampling.prompt_ids, sampling.prompt_ids],
      sampling_params: { max_new_tokens: 2, temperature: 0 },
      return_logprob: true,
      top_logprobs_num: [2, 0],
    });
    expectWellFormed(outs[0] as Output, 2);
    expect(outs[1]?.meta_info.output_token_logprobs).toHaveLength(2);
    expect(outs[1]?.meta_info).not.toHaveProperty("output_top_logprobs");
  });

  it.each([
    [{ top_logprobs_num: 2 }, '"top_logprobs_num" = 2 needs "return_logprob": true'],
    [
      { return_logprob: true, top_logprobs_num: 1025 },
      '"top_logprobs_num" must be an integer in [0, 1024]',
    ],
    [{ return_logprob: true, top_logprobs_num: -1 }, '"top_logprobs_num" must be an integer'],
    [{ return_logprob: true, top_logprobs_num: 1.5 }, '"top_logprobs_num" must be an integer'],
    [{ return_logprob: true, top_logprobs_num: [1] }, '"top_logprobs_num" must be one value'],
  ])("refuses %j naming the field, and keeps serving", async (extra, message) => {
    const r = await generate(server.base, { input_ids: [1, 2], ...extra });
    expect(r.status).toBe(400);
    expect((r.json as { error: string }).error).toContain(message);
    const ok = await generateOk<Output>(server.base, {
      input_ids: [1, 2],
      sampling_params: { max_new_tokens: 1 },
    });
    expect(ok.output_ids).toHaveLength(1);
  });
});

describe("top log-probs on qwen-bpe's greedy decode steps", () => {
  const cases = greedy().cases.filter((c) => c.model === "qwen-bpe");
  let server: RunningEngine;

  beforeAll(async () => {
    server = await startEngine(["--model", modelDir("qwen-bpe")]);
  }, 60_000);

  afterAll(async () => {
    if (server) expect((await server.stop()).code).toBe(0);
  });

  it("each token's list starts with the reference token and its reference log-prob", async () => {
    const outs = await generateOk<Output[]>(server.base, {
      input_ids: cases.map((c) => c.prompt_ids),
      sampling_params: GREEDY,
      return_logprob: true,
      top_logprobs_num: 5,
    });
    outs.forEach((out, i) => {
      const c = cases[i] as GreedyCase;
      expect(out.output_ids).toEqual(c.output_ids);
      expectWellFormed(out, 5);
      out.meta_info.output_top_logprobs?.forEach((top, t) => {
        const [lp, id] = top[0] as [number, number, null];
        expect(id).toBe(c.output_ids[t]);
        expect(Math.abs(lp - (c.logprobs[t] as number))).toBeLessThan(LOGPROB_TOL);
        // The greedy token is the argmax: the runner-up is less likely by the fixture's margin.
        expect(lp).toBeGreaterThan((top[1] as [number, number, null])[0]);
      });
    });
  });
});
