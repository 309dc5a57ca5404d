import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { INVALID_ACTION_MESSAGE } from "../../src/agent/observation.js";
import { RetrieverClient } from "../../src/agent/retriever-client.js";
import { type AgentSettings, rollout, rolloutAll } from "../../src/agent/rollout.js";
import { SglangClient } from "../../src/engine/client/sglang.js";
import type { EngineClient } from "../../src/engine/client/types.js";
import { VllmClient } from "../../src/engine/client/vllm.js";
import { PAUL_WALKER_CONTENTS, type ServedIndex, serveTestIndex } from "../retrieval/helpers.js";
import { EOS, agentTokenizer as tokenizer } from "./helpers.js";
import { fakeLogprob, type ScriptedEngine, startScriptedEngine } from "./scripted-engine.js";

const SETTINGS: AgentSettings = {
  maxTurns: 4,
  maxStartLength: 2048,
  maxPromptLength: 4096,
  maxResponseLength: 64,
  maxObsLength: 500,
  sampling: { temperature: 0, topP: 1, topK: -1 },
  compat: "none",
};

let served: ServedIndex;

beforeAll(async () => {
  served = await serveTestIndex();
}, 60_000);

afterAll(async () => {
  await served?.close();
});

/** The corpus's most frequent generated word: a query with it gets three documents. */
const common = () => served.ix.vocabulary[0] as string;

const retriever = (extra: Partial<ConstructorParameters<typeof RetrieverClient>[0]> = {}) =>
  new RetrieverClient({
    url: served.server.url,
    topk: 3,
    timeoutMs: 10_000,
    maxRetries: 0,
    ...extra,
  });

/** Replies by the number of observations already in the context (the turn index). */
function byTurn(replies: { text: string; eos?: boolean }[]) {
  return (context: string) => {
    const turn =
      context.split("<information>").length -
      1 +
      (context.split(INVALID_ACTION_MESSAGE).length - 1);
    return replies[Math.min(turn, replies.length - 1)] as { text: string; eos?: boolean };
  };
}

/** Replies in order, one per request (for a single trajectory whose context gets cut). */
function inOrder(replies: { text: string; eos?: boolean }[]) {
  let n = 0;
  return () => replies[Math.min(n++, replies.length - 1)] as { text: string; eos?: boolean };
}

async function withEngine<T>(
  script: Parameters<typeof startScriptedEngine>[2],
  run: (engine: ScriptedEngine, client: EngineClient) => Promise<T>,
  options: Parameters<typeof startScriptedEngine>[3] & { vllm?: boolean } = {},
): Promise<T> {
  const engine = await startScriptedEngine(tokenizer, EOS, script, options);
  try {
    const client = options.vllm ? new VllmClient(engine.url) : new SglangClient(engine.url);
    return await run(engine, client);
  } finally {
    await engine.close();
  }
}

const prompt = async (question: string) =>
  tokenizer.encode(`<|im_start|>user\nQuestion: ${question}<|im_end|>\n<|im_start|>assistant\n`, {
    addSpecialTokens: false,
  });

describe("rollout: Search-R1's turn semantics", () => {
  it("search then answer: exact observation, token in / token out, loss mask, log-probs", async () => {
    const promptIds = await prompt("who is Paul Walker?");
    await withEngine(
      byTurn([
        {
          text: `<think> look it up </think>\n<search> Paul Walker ${common()} </search> and more text`,
        },
        { text: "<think> found </think>\n<answer> an actor </answer> trailing", eos: true },
      ]),
      async (engine, client) => {
        // The test tokenizer spends many tokens on the documents: no truncation here.
        const t = await rollout(
          { promptIds, seed: null },
          { ...SETTINGS, maxObsLength: 4000 },
          {
            engine: client,
            retriever: retriever(),
            tokenizer,
          },
        );
        expect(t.turns.map((x) => x.action)).toEqual(["search", "answer"]);
        expect(t.turns[0]?.observationTruncated).toBe(false);
        expect(t.turns[0]?.query).toBe(`Paul Walker ${common()}`);
        expect(t.turns[1]?.query).toBe("an actor");
        expect(t.finishReason).toBe("answer");
        expect(t.searches).toBe(1);
        // The real BM25 server ranks the Paul Walker passage first.
        const docs = t.turns[0]?.documents ?? [];
        expect(docs).toHaveLength(3);
        expect(docs[0]).toEqual({ id: "0", contents: PAUL_WALKER_CONTENTS });
        const rest = docs
          .slice(1)
          .map((d, i) => {
            const [title, ...lines] = d.contents.split("\n");
            return `Doc ${i + 2}(Title: ${title}) ${lines.join("\n")}`;
          })
          .join("\n");
        expect(t.turns[0]?.observation).toBe(
          '\n\n<information>Doc 1(Title: "Paul Walker") Paul William Walker IV was an American ' +
            "actor best known for his role as Brian O'Conner in The Fast and the Furious " +
            `franchise.\n${rest}</information>\n\n`,
        );
        // Generation stopped at the token that completed "</search>": nothing after it.
        expect(t.turns[0]?.text.endsWith("</search>")).toBe(true);
        expect(t.turns[0]?.finish).toBe("stop");

        // The second request's context is the prompt, the engine's own ids, then the
        // observation's ids: nothing was decoded and re-encoded.
        const first = engine.requests[0];
        const second = engine.requests[1];
        expect(first?.inputIds).toEqual(promptIds);
        const gen0 = t.responseIds.slice(0, t.turns[0]?.tokens);
        const obsIds = await tokenizer.encode(t.turns[0]?.observation ?? "", {
          addSpecialTokens: false,
        });
        expect(second?.inputIds).toEqual([...promptIds, ...gen0, ...obsIds]);
        const gen1 = t.responseIds.slice(gen0.length + obsIds.length);
        expect(t.responseIds).toEqual([...gen0, ...obsIds, ...gen1]);
        expect(t.lossMask).toEqual([
          ...gen0.map(() => 1),
          ...obsIds.map(() => 0),
          ...gen1.map(() => 1),
        ]);
        expect(t.logprobs).toEqual([
          ...gen0.map((id, i) => fakeLogprob(id, i)),
          ...obsIds.map(() => null),
          ...gen1.map((id, i) => fakeLogprob(id, i)),
        ]);
        // The stop strings went to the engine; the trimmed text would lose the tag.
        const params = first?.body.sampling_params as Record<string, unknown>;
        expect(params.stop).toEqual(["</search>", "</answer>"]);
        expect(params.no_stop_trim).toBe(true);
        expect(params.max_new_tokens).toBe(SETTINGS.maxResponseLength);
        expect(params.temperature).toBe(0);
        expect(first?.body.return_logprob).toBe(true);
      },
    );
  });

  it("an invalid action gets the fixed message (mask 0) and the trajectory goes on; EOS is kept", async () => {
    const promptIds = await prompt("q?");
    await withEngine(
      byTurn([{ text: "I think it is Paris.", eos: true }, { text: "<answer>Paris</answer>" }]),
      async (_engine, client) => {
        const t = await rollout({ promptIds, seed: null }, SETTINGS, {
          engine: client,
          retriever: retriever(),
          tokenizer,
        });
        expect(t.turns.map((x) => x.action)).toEqual(["invalid", "answer"]);
        expect(t.invalidActions).toBe(1);
        expect(t.turns[0]?.observation).toBe(INVALID_ACTION_MESSAGE);
        const gen0 = t.turns[0]?.tokens ?? 0;
        expect(t.responseIds[gen0 - 1]).toBe(EOS);
        const msg = await tokenizer.encode(INVALID_ACTION_MESSAGE, { addSpecialTokens: false });
        expect(t.responseIds.slice(gen0, gen0 + msg.length)).toEqual(msg);
        expect(t.lossMask.slice(gen0, gen0 + msg.length).every((m) => m === 0)).toBe(true);
        expect(t.searches).toBe(0);
      },
    );
  });

  it("max_turns searches, then a final turn whose search gets no documents and no observation", async () => {
    const promptIds = await prompt("q?");
    const client = retriever();
    await withEngine(
      byTurn([{ text: "<search> Zürich lake </search>" }]),
      async (engine, engineClient) => {
        const t = await rollout(
          { promptIds, seed: null },
          { ...SETTINGS, maxTurns: 2 },
          {
            engine: engineClient,
            retriever: client,
            tokenizer,
          },
        );
        expect(engine.requests).toHaveLength(3);
        expect(t.turns.map((x) => x.action)).toEqual(["search", "search", "search"]);
        expect(t.searches).toBe(2);
        expect(client.stats.queries).toBe(2);
        expect(t.turns[2]?.documents).toEqual([]);
        expect(t.turns[2]?.observation).toBe("");
        expect(t.finishReason).toBe("max_turns");
        // The response ends with the final turn's generated tokens (mask 1).
        expect(t.lossMask.slice(-(t.turns[2]?.tokens ?? 0)).every((m) => m === 1)).toBe(true);
      },
    );
  });

  it("observations are right-truncated to max_obs_length; the turn budget ends a turn with `length`", async () => {
    const promptIds = await prompt("q?");
    await withEngine(
      byTurn([
        { text: "<search> Paul Walker </search>" },
        { text: "la la la la la la la la la la" },
      ]),
      async (_engine, client) => {
        const t = await rollout(
          { promptIds, seed: null },
          { ...SETTINGS, maxTurns: 1, maxObsLength: 10, maxResponseLength: 5 },
          { engine: client, retriever: retriever(), tokenizer },
        );
        expect(t.turns[0]?.observationTruncated).toBe(true);
        const full = await tokenizer.encode(t.turns[0]?.observation ?? "", {
          addSpecialTokens: false,
        });
        const gen0 = t.turns[0]?.tokens ?? 0;
        expect(t.responseIds.slice(gen0, gen0 + 10)).toEqual(full.slice(0, 10));
        expect(t.lossMask.filter((m) => m === 0)).toHaveLength(10);
        expect(t.turns[1]?.finish).toBe("length");
        expect(t.turns[1]?.tokens).toBe(5);
        expect(t.turns[1]?.action).toBe("invalid");
      },
    );
  });

  it("left-truncates the prompt to max_start_length and the context to max_prompt_length", async () => {
    const promptIds = await prompt("a long question with many many words in it to make it long?");
    await withEngine(
      inOrder([{ text: "<search> Paul Walker </search>" }, { text: "<answer> x </answer>" }]),
      async (engine, client) => {
        const t = await rollout(
          { promptIds, seed: null },
          { ...SETTINGS, maxStartLength: 12, maxPromptLength: 40 },
          { engine: client, retriever: retriever(), tokenizer },
        );
        expect(t.promptTruncated).toBe(true);
        expect(t.promptIds).toEqual(promptIds.slice(-12));
        expect(engine.requests[0]?.inputIds).toEqual(promptIds.slice(-12));
        const context = [...t.promptIds, ...t.responseIds.slice(0, -(t.turns[1]?.tokens ?? 0))];
        expect(engine.requests[1]?.inputIds).toEqual(context.slice(-40));
        expect(t.contextTruncations).toBe(1);
      },
    );
  });

  it("--compat search-r1-retokenize decodes, cuts and re-encodes each turn (no log-probs)", async () => {
    const promptIds = await prompt("q?");
    await withEngine(
      byTurn([
        { text: "<search> Paul Walker </search>" },
        { text: "<answer> an actor </answer>", eos: true },
      ]),
      async (_engine, client) => {
        const t = await rollout(
          { promptIds, seed: null },
          { ...SETTINGS, compat: "search-r1-retokenize" },
          { engine: client, retriever: retriever(), tokenizer },
        );
        const last = t.turns[1];
        const ids = t.responseIds.slice(-(last?.tokens ?? 0));
        expect(ids).toEqual(
          await tokenizer.encode("<answer> an actor </answer>", { addSpecialTokens: false }),
        );
        expect(ids).not.toContain(EOS);
        expect(t.logprobs.every((x) => x === null)).toBe(true);
      },
    );
  });

  it("a vLLM server gives the same trajectory as SGLang's /generate", async () => {
    const promptIds = await prompt("who is Paul Walker?");
    const script = byTurn([
      { text: "<search> Paul Walker </search>" },
      { text: "<answer> actor </answer>" },
    ]);
    const run = (vllm: boolean) =>
      withEngine(
        script,
        (_e, client) =>
          rollout({ promptIds, seed: 7 }, SETTINGS, {
            engine: client,
            retriever: retriever(),
            tokenizer,
          }),
        { vllm },
      );
    const [a, b] = [await run(false), await run(true)];
    expect(b.responseIds).toEqual(a.responseIds);
    expect(b.lossMask).toEqual(a.lossMask);
    expect(b.logprobs).toEqual(a.logprobs);
    expect(b.turns).toEqual(a.turns);
  });
});

describe("rolloutAll: concurrent trajectories", () => {
  it("runs trajectories independently and batches retriever calls that arrive together", async () => {
    const prompts = await Promise.all([0, 1, 2, 3, 4, 5].map((i) => prompt(`question ${i}?`)));
    const client = retriever({ batchWindowMs: 20 });
    await withEngine(
      byTurn([{ text: "<search> Paul Walker </search>" }, { text: "<answer> x </answer>" }]),
      async (engine, engineClient) => {
        const done: number[] = [];
        const results = await rolloutAll(
          prompts.map((promptIds, i) => ({ promptIds, seed: i })),
          SETTINGS,
          { engine: engineClient, retriever: client, tokenizer },
          { concurrency: 6, onDone: (_t, i) => void done.push(i) },
        );
        expect(results.map((t) => t.finishReason)).toEqual(Array(6).fill("answer"));
        expect(done.sort()).toEqual([0, 1, 2, 3, 4, 5]);
        // Six searches in one or two requests, not six.
        expect(client.stats.queries).toBe(6);
        expect(client.stats.requests).toBeLessThanOrEqual(2);
        // Distinct per-trajectory seeds went to the engine.
        const seeds = new Set(
          engine.requests.map(
            (r) => (r.body.sampling_params as { sampling_seed?: number }).sampling_seed,
          ),
        );
        expect(seeds.size).toBe(12);
      },
    );
  });

  it("a trajectory goes back to the engine as soon as its documents arrive (no turn barrier)", async () => {
    const fast = await prompt("fast?");
    const slow = await prompt("slow?");
    await withEngine(
      byTurn([{ text: "<search> Paul Walker </search>" }, { text: "<answer> x </answer>" }]),
      async (engine, client) => {
        await rolloutAll(
          [
            { promptIds: slow, seed: null },
            { promptIds: fast, seed: null },
          ],
          SETTINGS,
          { engine: client, retriever: retriever(), tokenizer },
          { concurrency: 2 },
        );
        const slowFirst = engine.requests.find(
          (r) => r.context.includes("slow?") && !r.context.includes("<information>"),
        );
        const fastSecond = engine.requests.find(
          (r) => r.context.includes("fast?") && r.context.includes("<information>"),
        );
        // The fast trajectory's second turn was asked for before the slow one's first turn ended.
        expect(fastSecond?.at).toBeLessThan((slowFirst?.at ?? 0) + 400);
      },
      {
        delayMs: (r) =>
          r.context.includes("slow?") && !r.context.includes("<information>") ? 600 : 0,
      },
    );
  });
});

describe("retriever faults", () => {
  /** Answers 503 `failures` times, then forwards to the real retriever. */
  async function flakyProxy(failures: number, status = 503) {
    let seen = 0;
    const server = http.createServer(async (req, res) => {
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      if (seen++ < failures) {
        res.writeHead(status, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: "busy" }));
        return;
      }
      const answer = await fetch(served.server.url, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: Buffer.concat(chunks),
      });
      res.writeHead(answer.status, { "content-type": "application/json" });
      res.end(await answer.text());
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/retrieve`;
    return { url, close: () => new Promise<void>((r) => server.close(() => r())) };
  }

  it("retries 5xx with back-off, announcing each retry, then succeeds", async () => {
    const proxy = await flakyProxy(2);
    const said: string[] = [];
    try {
      const client = retriever({
        url: proxy.url,
        maxRetries: 3,
        backoffMs: 10,
        onRetry: (m) => said.push(m),
      });
      const docs = await client.search("Paul Walker");
      expect(docs[0]?.contents).toBe(PAUL_WALKER_CONTENTS);
      expect(client.stats.retries).toBe(2);
      expect(said).toHaveLength(2);
      expect(said[0]).toMatch(/answered 503: busy; retry 1\/3/);
    } finally {
      await proxy.close();
    }
  });

  it("fails the run with a message naming the retriever when it stays down; never empty documents", async () => {
    const proxy = await flakyProxy(0);
    await proxy.close();
    const client = retriever({ url: proxy.url, maxRetries: 2, backoffMs: 5 });
    await expect(client.search("x")).rejects.toThrow(
      new RegExp(`retriever ${proxy.url} failed 3 times \\(connection refused`),
    );
  });

  it("a 4xx is not retried", async () => {
    const proxy = await flakyProxy(5, 400);
    try {
      const client = retriever({ url: proxy.url, maxRetries: 3, backoffMs: 5 });
      await expect(client.search("x")).rejects.toThrow(/refused the request \(400\): busy/);
      expect(client.stats.retries).toBe(0);
    } finally {
      await proxy.close();
    }
  });

  it("a failing retriever stops the other trajectories and rejects rolloutAll", async () => {
    const proxy = await flakyProxy(100);
    try {
      await withEngine(byTurn([{ text: "<search> a </search>" }]), async (_e, engineClient) => {
        const prompts = await Promise.all([1, 2, 3].map((i) => prompt(`q${i}?`)));
        await expect(
          rolloutAll(
            prompts.map((promptIds) => ({ promptIds, seed: null })),
            SETTINGS,
            {
              engine: engineClient,
              retriever: retriever({ url: proxy.url, maxRetries: 1, backoffMs: 5 }),
              tokenizer,
            },
            { concurrency: 3 },
          ),
        ).rejects.toThrow(/failed 2 times/);
      });
    } finally {
      await proxy.close();
    }
  });
});
