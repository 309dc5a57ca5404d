import { Tokenizer } from "tokenizers";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  fixture,
  GREEDY,
  type GreedyCase,
  generateOk,
  greedy,
  MODELS,
  modelDir,
  type Output,
  type RunningEngine,
  request,
  startEngine,
} from "./helpers.js";

/**
 * Greedy generation through the whole stack (HTTP, the native engine, the tokenizer)
 * against the PyTorch reference of make_fixtures.py: tokens exactly, log-probs within 1e-4
 * (float32, a different summation order), text as the tokenizer decodes it.
 */

const LOGPROB_TOL = 1e-4;
const { cases } = greedy();

/** Output ids, text and log-probs equal the reference's first `n` tokens. */
function expectReference(out: Output, c: GreedyCase, n = c.output_ids.length): void {
  expect(out.output_ids).toEqual(c.output_ids.slice(0, n));
  expect(out.meta_info.prompt_tokens).toBe(c.prompt_ids.length);
  expect(out.meta_info.completion_tokens).toBe(n);
  const lps = out.meta_info.output_token_logprobs;
  if (lps) {
    expect(lps.map((l) => l[1])).toEqual(out.output_ids);
    expect(lps.every((l) => l[2] === null)).toBe(true);
    lps.forEach(([lp], i) => {
      expect(Math.abs(lp - (c.logprobs[i] as number))).toBeLessThan(LOGPROB_TOL);
    });
  }
}

describe.each(MODELS)("%s: greedy generation equals the PyTorch reference", (model) => {
  const mine = cases.filter((c) => c.model === model);
  const byName = (name: string) => mine.find((c) => c.name === name) as GreedyCase;
  let server: RunningEngine;
  let tokenizer: Tokenizer;

  beforeAll(async () => {
    server = await startEngine(["--model", modelDir(model)]);
    tokenizer = Tokenizer.fromFile(`${modelDir(model)}/tokenizer.json`);
  }, 60_000);

  afterAll(async () => {
    if (server) expect((await server.stop()).code).toBe(0);
  });

  it("a batch of prompts of different lengths: tokens, log-probs and text", async () => {
    expect(new Set(mine.map((c) => c.prompt_ids.length)).size).toBeGreaterThanOrEqual(6);
    const outs = await generateOk<Output[]>(server.base, {
      input_ids: mine.map((c) => c.prompt_ids),
      sampling_params: GREEDY,
      return_logprob: true,
    });
    expect(outs).toHaveLength(mine.length);
    outs.forEach((out, i) => {
      const c = mine[i] as GreedyCase;
      expectReference(out, c);
      expect(out.text).toBe(c.text);
      expect(out.meta_info.finish_reason).toEqual({ type: "length", matched: null, length: 24 });
      expect(out.meta_info.weight_version).toBe("0");
    });
  });

  it("several requests in flight at once, each answered as one object", async () => {
    const outs = await Promise.all(
      mine.map((c) =>
        generateOk<Output>(server.base, {
          input_ids: c.prompt_ids,
          sampling_params: GREEDY,
          return_logprob: true,
        }),
      ),
    );
    outs.forEach((out, i) => {
      expect(Array.isArray(out)).toBe(false);
      expectReference(out, mine[i] as GreedyCase);
    });
  });

  it("a repeated prompt reuses its cached prefix (16-token granularity) and answers the same", async () => {
    const flushed = await request(server.base, "POST", "/flush_cache");
    expect(flushed.status).toBe(200);
    for (const name of ["len33", "len70"]) {
      const c = byName(name);
      const body = { input_ids: c.prompt_ids, sampling_params: GREEDY, return_logprob: true };
      const first = await generateOk<Output>(server.base, body);
      const second = await generateOk<Output>(server.base, body);
      expectReference(first, c);
      expectReference(second, c);
      expect(second.meta_info.cached_tokens).toBeGreaterThanOrEqual(
        Math.floor((c.prompt_ids.length - 1) / 16) * 16,
      );
      expect(second.meta_info.cached_tokens).toBeLessThan(c.prompt_ids.length);
      if (name === "len33") expect(first.meta_info.cached_tokens).toBe(0);
    }
    // len45 shares its first 32 tokens with len33 (and differs at token 33).
    const c45 = byName("len45");
    const out = await generateOk<Output>(server.base, {
      input_ids: c45.prompt_ids,
      sampling_params: GREEDY,
      return_logprob: true,
    });
    expectReference(out, c45);
    expect(out.meta_info.cached_tokens).toBe(32);
    const info = await request(server.base, "GET", "/get_server_info");
    expect(info.json.prefix_hit_tokens).toBeGreaterThan(0);
    expect(info.json.prefix_cache_hit_rate).toBeGreaterThan(0);
  });

  it("EOS ends a sequence (matched = its id, text without it) unless ignore_eos", async () => {
    const withEos = mine.filter((c) => c.eos_at !== null);
    expect(withEos.length).toBeGreaterThan(0);
    for (const c of withEos) {
      const at = c.eos_at as number;
      const body = {
        input_ids: c.prompt_ids,
        sampling_params: { temperature: 0, max_new_tokens: 24 },
      };
      const out = await generateOk<Output>(server.base, body);
      expectReference(out, c, at + 1);
      expect(out.meta_info.finish_reason).toEqual({ type: "stop", matched: c.output_ids[at] });
      expect(out.text).toBe(await tokenizer.decode(c.output_ids.slice(0, at), true));
      // Kept with no_stop_trim (visible with skip_special_tokens false).
      const kept = await generateOk<Output>(server.base, {
        ...body,
        sampling_params: {
          ...body.sampling_params,
          no_stop_trim: true,
          skip_special_tokens: false,
        },
      });
      expect(kept.text).toBe(await tokenizer.decode(c.output_ids.slice(0, at + 1), false));
      const ignored = await generateOk<Output>(server.base, {
        ...body,
        sampling_params: { ...body.sampling_params, ignore_eos: true },
      });
      expectReference(ignored, c);
      expect(ignored.meta_info.finish_reason.type).toBe("length");
    }
  });

  it("max_new_tokens cuts the reference short (finish length); 0 generates nothing", async () => {
    const c = byName("len17");
    for (const n of [1, 7]) {
      const out = await generateOk<Output>(server.base, {
        input_ids: c.prompt_ids,
        sampling_params: { ...GREEDY, max_new_tokens: n },
        return_logprob: true,
      });
      expectReference(out, c, n);
      expect(out.meta_info.finish_reason).toEqual({ type: "length", matched: null, length: n });
    }
    const none = await generateOk<Output>(server.base, {
      input_ids: c.prompt_ids,
      sampling_params: { max_new_tokens: 0 },
    });
    expect(none).toMatchObject({ text: "", output_ids: [], meta_info: { completion_tokens: 0 } });
  });

  it("stop_token_ids end at the first occurrence of any of them, matched = that id", async () => {
    const c = byName("len45");
    // The first token from the 4th on that does not occur before it.
    const k = c.output_ids.findIndex((id, i) => i >= 3 && !c.output_ids.slice(0, i).includes(id));
    const stopId = c.output_ids[k] as number;
    const out = await generateOk<Output>(server.base, {
      input_ids: c.prompt_ids,
      sampling_params: { ...GREEDY, stop_token_ids: [stopId, c.output_ids[k + 1] as number] },
      return_logprob: true,
    });
    expectReference(out, c, k + 1);
    expect(out.meta_info.finish_reason).toEqual({ type: "stop", matched: stopId });
    expect(out.text).toBe(await tokenizer.decode(c.output_ids.slice(0, k), true));
  });

  it("n > 1 answers a list of n (greedy: n equal outputs); a batch with n is input-major", async () => {
    const [a, b] = [byName("len5"), byName("len17")];
    const outs = await generateOk<Output[]>(server.base, {
      input_ids: a.prompt_ids,
      sampling_params: { ...GREEDY, n: 3 },
    });
    expect(outs).toHaveLength(3);
    for (const out of outs) expectReference(out, a);
    expect(new Set(outs.map((o) => o.meta_info.id)).size).toBe(3);
    const batch = await generateOk<Output[]>(server.base, {
      input_ids: [a.prompt_ids, b.prompt_ids],
      sampling_params: { ...GREEDY, n: 2, max_new_tokens: 5 },
    });
    expect(batch.map((o) => o.output_ids)).toEqual([
      a.output_ids.slice(0, 5),
      a.output_ids.slice(0, 5),
      b.output_ids.slice(0, 5),
      b.output_ids.slice(0, 5),
    ]);
  });
});

interface StopFixture {
  model: "qwen-bpe";
  prompt_ids: number[];
  max_new_tokens: number;
  cases: {
    name: string;
    stop: string;
    output_ids: number[];
    text: string;
    text_no_trim: string;
    matched_at: number;
  }[];
}

describe("stop strings (SGLang semantics), qwen-bpe", () => {
  const stops = fixture<StopFixture>("stop.json");
  let server: RunningEngine;

  beforeAll(async () => {
    server = await startEngine(["--model", modelDir(stops.model)]);
  }, 60_000);

  afterAll(async () => {
    if (server) expect((await server.stop()).code).toBe(0);
  });

  const body = (sampling: Record<string, unknown>) => ({
    input_ids: stops.prompt_ids,
    // The reference continuation goes on past EOS, as greedy.json's does.
    sampling_params: {
      temperature: 0,
      max_new_tokens: stops.max_new_tokens,
      ignore_eos: true,
      ...sampling,
    },
    return_logprob: true,
  });

  it.each(stops.cases.map((c) => [c.name, c]))(
    "%s: ends at the token that completes the string, text cut before it",
    async (_, c) => {
      const out = await generateOk<Output>(server.base, body({ stop: c.stop }));
      expect(out.output_ids).toEqual(c.output_ids);
      expect(out.output_ids).toHaveLength(c.matched_at + 1);
      expect(out.text).toBe(c.text);
      expect(out.meta_info.finish_reason).toEqual({ type: "stop", matched: c.stop });
      expect(out.meta_info.completion_tokens).toBe(c.output_ids.length);
      expect(out.meta_info.output_token_logprobs).toHaveLength(c.output_ids.length);
      const kept = await generateOk<Output>(
        server.base,
        body({ stop: [c.stop], no_stop_trim: true }),
      );
      expect(kept.output_ids).toEqual(c.output_ids);
      expect(kept.text).toBe(c.text_no_trim);
    },
  );

  it("with several stop strings the first one completed ends the sequence", async () => {
    const [first, later] = [...stops.cases].sort((a, b) => a.matched_at - b.matched_at) as [
      StopFixture["cases"][0],
      StopFixture["cases"][0],
    ];
    const out = await generateOk<Output>(server.base, body({ stop: [later.stop, first.stop] }));
    expect(out.output_ids).toEqual(first.output_ids);
    expect(out.meta_info.finish_reason.matched).toBe(first.stop);
    // The same in a batch and with n > 1, next to a sequence without stop strings.
    const outs = await generateOk<Output[]>(server.base, {
      input_ids: [stops.prompt_ids, stops.prompt_ids],
      sampling_params: [
        { temperature: 0, max_new_tokens: 24, ignore_eos: true, stop: later.stop, n: 2 },
        { temperature: 0, max_new_tokens: 24, ignore_eos: true },
      ],
    });
    expect(outs.map((o) => o.output_ids.length)).toEqual([
      later.matched_at + 1,
      later.matched_at + 1,
      24,
    ]);
    expect(outs[0]?.text).toBe(later.text);
  });
});
