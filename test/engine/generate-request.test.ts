import { describe, expect, it } from "vitest";
import {
  DEFAULT_MAX_NEW_TOKENS,
  type ModelLimits,
  parseGenerateRequest,
} from "../../src/engine/generate-request.js";
import { HttpError } from "../../src/runtime/http-server.js";

const LIMITS: ModelLimits = { vocabSize: 100, contextLength: 32, tokenizer: true };

function refused(body: unknown, limits = LIMITS): HttpError {
  try {
    parseGenerateRequest(body, limits);
  } catch (err) {
    expect(err).toBeInstanceOf(HttpError);
    return err as HttpError;
  }
  throw new Error(`accepted ${JSON.stringify(body)}`);
}

describe("POST /generate request: what is accepted", () => {
  it("one input: SGLang's defaults, one sequence, answered as an object", () => {
    const r = parseGenerateRequest({ input_ids: [1, 2, 3] }, LIMITS);
    expect(r.single).toBe(true);
    expect(r.batch).toBe(false);
    expect(r.sequences).toEqual([
      {
        input: 0,
        sample: 0,
        inputIds: [1, 2, 3],
        returnLogprob: false,
        topLogprobs: 0,
        params: {
          // 128 by default, clamped to the 29 tokens left in a context of 32.
          maxNewTokens: Math.min(DEFAULT_MAX_NEW_TOKENS, 29),
          temperature: 1,
          topP: 1,
          topK: -1,
          minP: 0,
          stop: [],
          stopTokenIds: [],
          ignoreEos: false,
          seed: null,
          skipSpecialTokens: true,
          noStopTrim: false,
          repetitionPenalty: 1,
          frequencyPenalty: 0,
          presencePenalty: 0,
          minNewTokens: 0,
          logitBias: [],
        },
      },
    ]);
  });

  it("max_new_tokens is clamped to the room left in the context; null means all of it", () => {
    const at = (ids: number[], max: number | null) =>
      parseGenerateRequest({ input_ids: ids, sampling_params: { max_new_tokens: max } }, LIMITS)
        .sequences[0]?.params.maxNewTokens;
    expect(at([1, 2], 8)).toBe(8);
    expect(at([1, 2], 100)).toBe(30);
    expect(at([1, 2], null)).toBe(30);
    expect(at([1, 2], 0)).toBe(0);
    expect(at(new Array(31).fill(1), 5)).toBe(1);
  });

  it("n > 1 expands input-major with seed + i; a single input with n > 1 answers a list", () => {
    const r = parseGenerateRequest(
      { input_ids: [5, 6], sampling_params: { n: 3, seed: 40, temperature: 0.7, stop: "x" } },
      LIMITS,
    );
    expect(r.single).toBe(false);
    expect(r.sequences.map((s) => [s.input, s.sample, s.params.seed])).toEqual([
      [0, 0, 40],
      [0, 1, 41],
      [0, 2, 42],
    ]);
    expect(r.sequences[2]?.params.stop).toEqual(["x"]);
  });

  it("a batch takes one dict for all, or one per input, and return_logprob per input", () => {
    const r = parseGenerateRequest(
      {
        input_ids: [[1], [2, 3]],
        sampling_params: [
          { n: 2, sampling_seed: 7 },
          { temperature: 0, stop_token_ids: [9, 99] },
        ],
        return_logprob: [true, false],
      },
      LIMITS,
    );
    expect(r.single).toBe(false);
    expect(r.batch).toBe(true);
    expect(r.sequences.map((s) => [s.input, s.sample, s.params.seed, s.returnLogprob])).toEqual([
      [0, 0, 7, true],
      [0, 1, 8, true],
      [1, 0, null, false],
    ]);
    expect(r.sequences[2]?.params.stopTokenIds).toEqual([9, 99]);
    const one = parseGenerateRequest({ input_ids: [[1]], sampling_params: { n: 1 } }, LIMITS);
    expect(one.single).toBe(false);
  });

  it("accepts SGLang's other keys at their neutral values, as RL clients send them", () => {
    const r = parseGenerateRequest(
      {
        input_ids: [1],
        stream: false,
        logprob_start_len: -1,
        top_logprobs_num: 0,
        return_text_in_logprobs: false,
        lora_path: null,
        sampling_params: {
          repetition_penalty: 1.0,
          presence_penalty: 0,
          frequency_penalty: 0,
          min_new_tokens: 0,
          spaces_between_special_tokens: true,
          regex: null,
          json_schema: null,
          top_k: 5,
          min_p: 0.05,
          top_p: 0.9,
        },
      },
      LIMITS,
    );
    expect(r.sequences[0]?.params).toMatchObject({ topK: 5, minP: 0.05, topP: 0.9 });
  });
});

describe("POST /generate request: every refusal is a 400 naming the field", () => {
  it.each([
    [[1, 2], "JSON object"],
    [{}, '"input_ids" is required'],
    [{ input_ids: "hello" }, '"input_ids" must be'],
    [{ input_ids: [] }, '"input_ids" is empty'],
    [{ input_ids: [[1], []] }, '"input_ids[1]" is empty'],
    [{ input_ids: [1, 2.5] }, '"input_ids[1]"'],
    [{ input_ids: [1, -1] }, '"input_ids[1]"'],
    [{ input_ids: [1, 100] }, '"input_ids[1]" must be a token id, an integer in [0, 100)'],
    [{ input_ids: [[1], [2, "3"]] }, '"input_ids[1][1]"'],
    [{ input_ids: new Array(32).fill(1) }, "context length of 32"],
    [{ input_ids: [1], text: "hi" }, '"text" input is not supported'],
    [{ input_ids: [1], stream: true }, '"stream": true is not supported'],
    [{ input_ids: [1], logprob_start_len: 0 }, '"logprob_start_len" = 0 is not supported'],
    [{ input_ids: [1], max_new_tokens: 3 }, '"max_new_tokens" is not a known key'],
    [{ input_ids: [1], return_logprob: "yes" }, '"return_logprob"'],
    [{ input_ids: [[1], [2]], return_logprob: [true] }, '"return_logprob" has 1 entries'],
    [{ input_ids: [1], sampling_params: 3 }, '"sampling_params" must be an object'],
    [{ input_ids: [1], sampling_params: [{}] }, '"sampling_params" must be one object'],
    [{ input_ids: [[1], [2]], sampling_params: [{}] }, '"sampling_params" has 1 entries'],
    [{ input_ids: [[1], [2]], sampling_params: [{}, 5] }, '"sampling_params[1]" must be'],
    [
      { input_ids: [1], sampling_params: { temprature: 0 } },
      'did you mean "sampling_params.temperature"',
    ],
    [
      { input_ids: [1], sampling_params: { max_tokens: 5 } },
      'did you mean "sampling_params.max_new_tokens"',
    ],
    [
      { input_ids: [1], sampling_params: { max_new_tokens: -1 } },
      '"sampling_params.max_new_tokens"',
    ],
    [
      { input_ids: [1], sampling_params: { max_new_tokens: 1.5 } },
      '"sampling_params.max_new_tokens"',
    ],
    [
      { input_ids: [1], sampling_params: { max_new_tokens: "8" } },
      '"sampling_params.max_new_tokens"',
    ],
    [{ input_ids: [1], sampling_params: { temperature: -0.1 } }, '"sampling_params.temperature"'],
    [{ input_ids: [1], sampling_params: { temperature: null } }, '"sampling_params.temperature"'],
    [
      { input_ids: [1], sampling_params: { top_p: 0 } },
      '"sampling_params.top_p" must be a number in (0, 1]',
    ],
    [{ input_ids: [1], sampling_params: { top_p: 1.5 } }, '"sampling_params.top_p"'],
    [{ input_ids: [1], sampling_params: { top_k: 0 } }, '"sampling_params.top_k" must be -1 (off)'],
    [{ input_ids: [1], sampling_params: { top_k: -2 } }, '"sampling_params.top_k"'],
    [{ input_ids: [1], sampling_params: { min_p: -0.5 } }, '"sampling_params.min_p"'],
    [{ input_ids: [1], sampling_params: { n: 0 } }, '"sampling_params.n" must be an integer ≥ 1'],
    [{ input_ids: [1], sampling_params: { n: 70000 } }, '"sampling_params.n"'],
    [{ input_ids: [1], sampling_params: { seed: -3 } }, '"sampling_params.seed"'],
    [
      { input_ids: [1], sampling_params: { seed: 1, sampling_seed: 2 } },
      '"sampling_params.seed" and',
    ],
    [{ input_ids: [1], sampling_params: { stop: 5 } }, '"sampling_params.stop" must be'],
    [
      { input_ids: [1], sampling_params: { stop: ["a", 1] } },
      '"sampling_params.stop[1]" must be a string',
    ],
    [{ input_ids: [1], sampling_params: { stop: [""] } }, '"sampling_params.stop[0]" is empty'],
    [
      { input_ids: [1], sampling_params: { stop_token_ids: [1, 100] } },
      '"sampling_params.stop_token_ids[1]"',
    ],
    [
      { input_ids: [1], sampling_params: { stop_token_ids: 3 } },
      '"sampling_params.stop_token_ids"',
    ],
    [{ input_ids: [1], sampling_params: { ignore_eos: "true" } }, '"sampling_params.ignore_eos"'],
    [
      { input_ids: [1], sampling_params: { skip_special_tokens: 1 } },
      '"sampling_params.skip_special_tokens"',
    ],
    [{ input_ids: [1], sampling_params: { no_stop_trim: null } }, '"sampling_params.no_stop_trim"'],
    [
      { input_ids: [1], sampling_params: { repetition_penalty: 2.5 } },
      '"sampling_params.repetition_penalty" must be a number in (0, 2]',
    ],
    [
      { input_ids: [1], sampling_params: { stop_regex: "a+" } },
      '"sampling_params.stop_regex" = "a+" is not supported',
    ],
    [
      { input_ids: [1], sampling_params: { regex: "a+" } },
      '"sampling_params.regex" needs constrained decoding, which this server cannot do',
    ],
    [{ input_ids: [[1], [2]], sampling_params: [{}, { top_p: 2 }] }, '"sampling_params[1].top_p"'],
  ])("%j", (body, mention) => {
    const err = refused(body);
    expect(err.status).toBe(400);
    expect(err.message).toContain(mention);
  });

  it("stop strings need the tokenizer (--skip-tokenizer-init)", () => {
    const err = refused(
      { input_ids: [1], sampling_params: { stop: ["</answer>"] } },
      { ...LIMITS, tokenizer: false },
    );
    expect(err.message).toContain('"sampling_params.stop"');
    expect(err.message).toContain("--skip-tokenizer-init");
    // Stop token ids work without it.
    expect(
      parseGenerateRequest(
        { input_ids: [1], sampling_params: { stop_token_ids: [3], stop: [] } },
        { ...LIMITS, tokenizer: false },
      ).sequences,
    ).toHaveLength(1);
  });
});
