// The engine router of `train --gpus N` (src/engine/client/router.ts): every turn of a
// trajectory on the replica that served its first, new trajectories to the least loaded
// replica, new weights to every replica, and a replica's failure named. Against scripted
// SGLang stand-ins (test/agent/scripted-engine.ts) and, for the choice itself, in-memory
// engines whose answers the test releases.
import { afterEach, describe, expect, it } from "vitest";
import { INVALID_ACTION_MESSAGE } from "../../src/agent/observation.js";
import { RetrieverClient } from "../../src/agent/retriever-client.js";
import { type AgentSettings, rolloutAll } from "../../src/agent/rollout.js";
import { EngineRouter } from "../../src/engine/client/router.js";
import { SglangClient } from "../../src/engine/client/sglang.js";
import type { EngineClient, TurnOutput, TurnRequest } from "../../src/engine/client/types.js";
import { ServiceError } from "../../src/runtime/errors.js";
import { EOS, agentTokenizer as tokenizer } from "./helpers.js";
import { type ScriptedEngine, startScriptedEngine } from "./scripted-engine.js";

const SETTINGS: AgentSettings = {
  maxTurns: 3,
  maxStartLength: 2048,
  maxPromptLength: 4096,
  maxResponseLength: 32,
  maxObsLength: 500,
  sampling: { temperature: 1, topP: 1, topK: -1 },
  compat: "none",
};

// Never asked: the scripts below take invalid actions, then answer.
const retriever = new RetrieverClient({
  url: "http://127.0.0.1:9",
  topk: 3,
  timeoutMs: 1000,
  maxRetries: 0,
});

/** An invalid action, a second one, then the answer: three turns, no retriever. */
function threeTurns(context: string) {
  const turn = context.split(INVALID_ACTION_MESSAGE).length - 1;
  const question = /Question: (\w+)/.exec(context)?.[1];
  return turn < 2
    ? { text: `hmm ${question} ${turn}`, eos: true }
    : { text: `<answer>${question}</answer>` };
}

const started: ScriptedEngine[] = [];
afterEach(async () => {
  await Promise.all(started.splice(0).map((e) => e.close()));
});

async function replicas(n: number, delayMs = 0): Promise<ScriptedEngine[]> {
  const engines = await Promise.all(
    Array.from({ length: n }, () =>
      startScriptedEngine(tokenizer, EOS, threeTurns, { delayMs: () => delayMs }),
    ),
  );
  started.push(...engines);
  return engines;
}

const tasks = (questions: string[]) =>
  Promise.all(
    questions.map(async (q, i) => ({
      promptIds: await tokenizer.encode(
        `<|im_start|>user\nQuestion: ${q}<|im_end|>\n<|im_start|>assistant\n`,
        { addSpecialTokens: false },
      ),
      seed: 1000 + i,
    })),
  );

const QUESTIONS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"];

describe("EngineRouter over scripted replicas", () => {
  it("keeps every turn of a trajectory on one replica, uses both, and changes no result", async () => {
    const engines = await replicas(2, 5);
    const router = new EngineRouter(engines.map((e) => new SglangClient(e.url)));
    const parts = { engine: router, retriever, tokenizer };
    const routed = await rolloutAll(await tasks(QUESTIONS), SETTINGS, parts, { concurrency: 4 });
    expect(routed.map((t) => t.turns.map((x) => x.action))).toEqual(
      QUESTIONS.map(() => ["invalid", "invalid", "answer"]),
    );
    // Each question's three requests went to one replica, with its own seeds.
    const where = new Map<string, number[]>();
    engines.forEach((engine, r) => {
      for (const request of engine.requests) {
        const q = /Question: (\w+)/.exec(request.context)?.[1] as string;
        where.set(q, [...(where.get(q) ?? []), r]);
      }
    });
    for (const q of QUESTIONS) {
      const seen = where.get(q) ?? [];
      expect(seen, q).toHaveLength(3);
      expect(new Set(seen).size, `${q}: ${seen}`).toBe(1);
    }
    // Both replicas served trajectories, and the counts add up; nothing is left in flight.
    expect(router.served.every((n) => n > 0)).toBe(true);
    expect(router.served.reduce((a, b) => a + b)).toBe(QUESTIONS.length);
    expect(router.load).toEqual([0, 0]);
    expect(engines.map((e) => e.requests.length)).toEqual(router.served.map((n) => 3 * n));

    // One engine gives the same trajectories (the seeds travel with the requests).
    const [one] = await replicas(1);
    const single = await rolloutAll(
      await tasks(QUESTIONS),
      SETTINGS,
      { ...parts, engine: new SglangClient((one as ScriptedEngine).url) },
      { concurrency: 4 },
    );
    const strip = (t: (typeof single)[number]) => ({ ...t, timing: null });
    expect(routed.map(strip)).toEqual(single.map(strip));
    const seeds = (e: ScriptedEngine[]) =>
      e
        .flatMap((x) => x.requests)
        .map((r) => (r.body.sampling_params as { sampling_seed: number }).sampling_seed)
        .sort();
    expect(seeds(engines)).toEqual(seeds([one as ScriptedEngine]));
  });

  it("a replica that is gone fails the request naming the replica", async () => {
    const engines = await replicas(2);
    const router = new EngineRouter(engines.map((e) => new SglangClient(e.url)));
    await (engines[1] as ScriptedEngine).close();
    const [task] = await tasks(["alpha"]);
    const first = router.route(); // replica 0
    const second = router.route();
    const request: TurnRequest = {
      inputIds: task?.promptIds ?? [],
      maxNewTokens: 8,
      sampling: SETTINGS.sampling,
      stop: [],
      seed: 1,
    };
    const held = first.generate(request);
    await expect(second.generate(request)).rejects.toThrow(
      new RegExp(`^engine replica 1: engine ${engines[1]?.url}/generate is unreachable`),
    );
    await held;
  });
});

/** An engine whose answers the test gives: `pending` holds one resolver per request. */
function heldEngine(name: string) {
  const pending: (() => void)[] = [];
  const updates: string[] = [];
  let updating: (() => void) | null = null;
  const engine: EngineClient = {
    url: `http://${name}`,
    generate: () =>
      new Promise<TurnOutput>((resolve) =>
        pending.push(() =>
          resolve({
            outputIds: [1],
            logprobs: [0],
            finish: "stop",
            matched: 1,
            weightVersion: name,
          }),
        ),
      ),
    updateWeightsFromDisk: (path) =>
      new Promise<void>((resolve) => {
        updates.push(path);
        updating = resolve;
      }),
  };
  return { engine, pending, updates, finishUpdate: () => updating?.() };
}

const ANY: TurnRequest = {
  inputIds: [1],
  maxNewTokens: 1,
  sampling: { temperature: 0, topP: 1, topK: -1 },
  stop: [],
  seed: null,
};

describe("EngineRouter's choice", () => {
  it("gives a new trajectory to the replica with the fewest in flight, ties to the lowest index", async () => {
    const engines = [heldEngine("a"), heldEngine("b"), heldEngine("c")];
    const router = new EngineRouter(engines.map((e) => e.engine));
    const replicaOf = async (route: ReturnType<EngineRouter["route"]>) => {
      const before = router.served;
      void route.generate(ANY);
      return router.served.findIndex((n, i) => n > (before[i] as number));
    };
    const routes = Array.from({ length: 6 }, () => router.route());
    // No route counts until its first turn.
    expect(router.load).toEqual([0, 0, 0]);
    expect(await replicaOf(routes[0] as never)).toBe(0);
    expect(await replicaOf(routes[1] as never)).toBe(1);
    expect(await replicaOf(routes[2] as never)).toBe(2);
    expect(await replicaOf(routes[3] as never)).toBe(0); // 1,1,1: the lowest index
    expect(router.load).toEqual([2, 1, 1]);
    routes[2]?.release();
    routes[2]?.release(); // twice is once
    expect(router.load).toEqual([2, 1, 0]);
    expect(await replicaOf(routes[4] as never)).toBe(2);
    routes[0]?.release();
    routes[3]?.release();
    expect(await replicaOf(routes[5] as never)).toBe(0);
    expect(router.load).toEqual([1, 1, 1]);

    // A later turn stays where the first went, whatever the loads.
    void routes[5]?.generate(ANY);
    expect(router.served).toEqual([3, 1, 2]);
    expect(engines[0]?.pending).toHaveLength(4);

    // A single request (no trajectory) takes the least loaded and counts while it runs.
    routes[5]?.release();
    routes[1]?.release();
    expect(router.load).toEqual([0, 0, 1]);
    const one = router.generate(ANY);
    expect(router.load).toEqual([1, 0, 1]);
    engines[0]?.pending.at(-1)?.();
    expect((await one).weightVersion).toBe("a");
    expect(router.load).toEqual([0, 0, 1]);
    await expect(routes[0]?.generate(ANY) as Promise<unknown>).rejects.toThrow(
      /used after release/,
    );
  });

  it("sends new weights to every replica at once and resolves when all have them", async () => {
    const engines = [heldEngine("a"), heldEngine("b")];
    const router = new EngineRouter(engines.map((e) => e.engine));
    let done = false;
    const update = router.updateWeightsFromDisk("/dev/shm/step_3").then(() => {
      done = true;
    });
    await new Promise((r) => setTimeout(r, 10));
    // Both started before either finished.
    expect(engines.map((e) => e.updates)).toEqual([["/dev/shm/step_3"], ["/dev/shm/step_3"]]);
    engines[0]?.finishUpdate();
    await new Promise((r) => setTimeout(r, 10));
    expect(done).toBe(false);
    engines[1]?.finishUpdate();
    await update;
    expect(done).toBe(true);
  });

  it("names the replica whose update failed", async () => {
    const ok = heldEngine("a").engine;
    const refusing: EngineClient = {
      url: "http://b",
      generate: () => Promise.reject(new Error("unused")),
      updateWeightsFromDisk: () =>
        Promise.reject(new ServiceError("engine http://b did not load /w")),
    };
    const router = new EngineRouter([{ ...ok, updateWeightsFromDisk: async () => {} }, refusing]);
    await expect(router.updateWeightsFromDisk("/w")).rejects.toThrow(
      "engine replica 1: engine http://b did not load /w",
    );
  });
});
