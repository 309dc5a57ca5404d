/**
 * SGLang's penalties and OpenAI's logit_bias through the real native engine
 * (backend/sample_row.h's LogitsAdjust, in vLLM's order):
 * - frequency_penalty, presence_penalty and logit_bias: at every step the whole distribution
 *   (top log-probs over the vocabulary) is the unconstrained one at the same place (a
 *   one-token run) with each output token's logit lowered by frequency × its count +
 *   presence, and the biases added, renormalised;
 * - repetition_penalty against make_fixtures.py's PyTorch logits of tiny-vocab: the prompt's
 *   tokens' positive logits divided by it, negative ones multiplied, then log_softmax;
 * - min_new_tokens: no end token before it, even one biased to +100;
 * - the OpenAI routes' names for them (vLLM's min_tokens), and the refusals.
 */
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  fixture,
  generate,
  generateOk,
  logprobsById,
  logSumExp,
  modelDir,
  nextTokenLogprobs,
  type Output,
  type RunningEngine,
  startEngine,
} from "./helpers.js";

const QWEN = modelDir("qwen-bpe");
const VOCAB = 451;
const EOS = [450, 448];
const PROMPT = [17, 42, 99, 7];
const LOGPROB_TOL = 1e-4;

let server: RunningEngine;

beforeAll(async () => {
  server = await startEngine(["--model", QWEN]);
}, 60_000);

afterAll(async () => {
  if (server) expect((await server.stop()).code).toBe(0);
});

describe("penalties and logit_bias on /generate", () => {
  it("frequency, presence and logit_bias: the unconstrained distribution, shifted and renormalised", async () => {
    const bias: Record<string, number> = { "17": 2.5, "99": -3, "200": 1.25 };
    const [frequency, presence] = [0.7, 0.4];
    const out = await generateOk<Output>(server.base, {
      input_ids: PROMPT,
      sampling_params: {
        temperature: 1,
        seed: 4,
        max_new_tokens: 8,
        ignore_eos: true,
        frequency_penalty: frequency,
        presence_penalty: presence,
        logit_bias: bias,
      },
      return_logprob: true,
      top_logprobs_num: VOCAB,
    });
    const tops = out.meta_info.output_top_logprobs as [number, number, null][][];
    let withOutput = 0;
    for (let t = 0; t < out.output_ids.length; t++) {
      const before = out.output_ids.slice(0, t);
      const rawOf = await nextTokenLogprobs(server.base, [...PROMPT, ...before], VOCAB);
      const count = (id: number) => before.filter((x) => x === id).length;
      const shifted = Array.from({ length: VOCAB }, (_, id) => {
        const n = count(id);
        return (
          (rawOf.get(id) as number) +
          (bias[String(id)] ?? 0) -
          frequency * n -
          (n > 0 ? presence : 0)
        );
      });
      const norm = logSumExp(shifted);
      const got = logprobsById(tops[t] ?? []);
      expect(got.size).toBe(VOCAB);
      for (let id = 0; id < VOCAB; id++) {
        expect(Math.abs((got.get(id) as number) - ((shifted[id] as number) - norm))).toBeLessThan(
          LOGPROB_TOL,
        );
      }
      if (before.length > 0) withOutput++;
    }
    expect(withOutput).toBe(7); // the penalties had output tokens to act on at 7 of 8 steps
  });

  it("min_new_tokens: no end token before it, then the biased EOS at once", async () => {
    const outs = await generateOk<Output[]>(server.base, {
      input_ids: PROMPT,
      sampling_params: {
        temperature: 1,
        seed: 9,
        n: 4,
        max_new_tokens: 20,
        min_new_tokens: 5,
        logit_bias: { "450": 100 },
      },
      return_logprob: true,
      top_logprobs_num: VOCAB,
    });
    for (const o of outs) {
      expect(o.output_ids).toHaveLength(6);
      expect(o.output_ids[5]).toBe(450);
      expect(o.meta_info.finish_reason).toMatchObject({ type: "stop", matched: 450 });
      const tops = o.meta_info.output_top_logprobs as [number, number, null][][];
      for (let t = 0; t < 5; t++) {
        const ids = (tops[t] ?? []).map(([, id]) => id);
        expect(ids).toHaveLength(VOCAB - EOS.length); // barred: not listed
        for (const e of EOS) expect(ids).not.toContain(e);
      }
    }
  });

  it("refuses values out of SGLang's ranges, naming the field; the server keeps serving", async () => {
    const refused = async (sampling: Record<string, unknown>, message: RegExp) => {
      const r = await generate(server.base, { input_ids: PROMPT, sampling_params: sampling });
      expect(r.status).toBe(400);
      expect((r.json as { error: string }).error).toMatch(message);
    };
    await refused(
      { repetition_penalty: 0 },
      /"sampling_params\.repetition_penalty" must be a number in \(0, 2\]/,
    );
    await refused(
      { frequency_penalty: 2.5 },
      /"sampling_params\.frequency_penalty" must be a number in \[-2, 2\]/,
    );
    await refused({ presence_penalty: "1" }, /"sampling_params\.presence_penalty"/);
    await refused(
      { min_new_tokens: 9, max_new_tokens: 8 },
      /"sampling_params\.min_new_tokens" must be an integer in \[0, max_new_tokens = 8\]/,
    );
    await refused(
      { logit_bias: { "451": 1 } },
      /"sampling_params\.logit_bias\.451": the key must be a token id below 451/,
    );
    await refused({ logit_bias: { "3": 101 } }, /must be a number in \[-100, 100\]/);
    await refused({ logit_bias: [1, 2] }, /must be an object of token id → bias/);
    await refused(
      { min_new_tokens: 2, json_schema: "{}" },
      /cannot be set with "sampling_params\.json_schema"/,
    );
    const ok = await generateOk<Output>(server.base, {
      input_ids: PROMPT,
      sampling_params: { max_new_tokens: 2 },
    });
    expect(ok.output_ids).toHaveLength(2);
  });

  it("the OpenAI routes take the same settings under OpenAI's and vLLM's names", async () => {
    const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: "none", maxRetries: 0 });
    const settings = {
      temperature: 1,
      seed: 12,
      max_tokens: 10,
      frequency_penalty: 1.1,
      presence_penalty: -0.5,
    };
    const completion = await client.completions.create({
      model: QWEN,
      prompt: PROMPT,
      ...settings,
      logit_bias: { "33": 4 },
      // biome-ignore lint/suspicious/noExplicitAny: vLLM's extensions of the request
      ...({ min_tokens: 3, repetition_penalty: 1.2, return_token_ids: true } as any),
    });
    const ref = await generateOk<Output>(server.base, {
      input_ids: PROMPT,
      sampling_params: {
        temperature: 1,
        seed: 12,
        max_new_tokens: 10,
        frequency_penalty: 1.1,
        presence_penalty: -0.5,
        logit_bias: { "33": 4 },
        min_new_tokens: 3,
        repetition_penalty: 1.2,
      },
    });
    // biome-ignore lint/suspicious/noExplicitAny: vLLM's token_ids
    expect((completion.choices[0] as any).token_ids).toEqual(ref.output_ids);
    const err = await client.completions
      // biome-ignore lint/suspicious/noExplicitAny: an out-of-range vLLM key
      .create({ model: QWEN, prompt: PROMPT, ...({ repetition_penalty: 3 } as any) })
      .then(
        () => null,
        (e: unknown) => e,
      );
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect((err as { param: string }).param).toBe("repetition_penalty");
  });
});

describe("repetition_penalty against the PyTorch logits of tiny-vocab (make_fixtures.py)", () => {
  const sampling = fixture<{ prompt_ids: number[]; logits: number[] }>("sampling.json");
  let tiny: RunningEngine;
  beforeAll(async () => {
    tiny = await startEngine(["--model", modelDir("tiny-vocab")]);
  }, 60_000);
  afterAll(async () => {
    if (tiny) expect((await tiny.stop()).code).toBe(0);
  });

  it.each([1.3, 0.7])(
    "penalty %s on the prompt's tokens: CTRL's rule, then log_softmax",
    async (penalty) => {
      const out = await generateOk<Output>(tiny.base, {
        input_ids: sampling.prompt_ids,
        sampling_params: { temperature: 1, max_new_tokens: 1, repetition_penalty: penalty },
        return_logprob: true,
        top_logprobs_num: sampling.logits.length,
      });
      const seen = new Set(sampling.prompt_ids);
      const z = sampling.logits.map((x, id) =>
        seen.has(id) ? (x > 0 ? x / penalty : x * penalty) : x,
      );
      const norm = logSumExp(z);
      const got = logprobsById(
        (out.meta_info.output_top_logprobs as [number, number, null][][])[0] ?? [],
      );
      expect(got.size).toBe(z.length);
      z.forEach((x, id) => {
        expect(Math.abs((got.get(id) as number) - (x - norm))).toBeLessThan(LOGPROB_TOL);
      });
      // The penalty changed something: a prompt token's log-prob moved.
      const plain = sampling.logits.map((x) => x - logSumExp(sampling.logits));
      const moved = [...seen].some(
        (id) => Math.abs((got.get(id) as number) - (plain[id] as number)) > 1e-2,
      );
      expect(moved).toBe(true);
    },
  );
});
