import { setMaxListeners } from "node:events";
import type { EngineClient, Sampling } from "../engine/client/types.js";
import { ServiceError } from "../runtime/errors.js";
import type { ModelTokenizer } from "../text/model-tokenizer.js";
import type { TextTokenizer } from "../text/tokenizer.js";
import { cutAtAction, parseAction, STOP_STRINGS } from "./actions.js";
import { type HermesFormat, hermesStep } from "./hermes-step.js";
import { INVALID_ACTION_MESSAGE, informationBlock, type Passage } from "./observation.js";
import type { RetrieverClient } from "./retriever-client.js";
import type { Trajectory, Turn } from "./trajectory.js";

/**
 * Search-R1's multi-turn rollout (Search-R1 search_r1/llm_agent/generation.py,
 * LLMGenerationManager.run_llm_loop) for one trajectory:
 * generate until `</search>`, `</answer>`, EOS or the turn's token budget; a search sends
 * its query to the retriever and appends the documents; an invalid action appends the fixed
 * message; `maxTurns` such turns, then one final turn whose search gets no documents.
 *
 * Where this differs from the original, on purpose:
 * - the engine stops at the first stop string (the original generated to EOS and cut the
 *   text at the first `</search>`, else the first `</answer>`);
 * - generated tokens are kept as the engine returned them, EOS included (the original
 *   decoded, cut and re-encoded them, losing EOS); `compat: "search-r1-retokenize"` does
 *   what the original did.
 *
 * With `format: hermes` the same loop runs verl's tool agent instead (hermes-step.ts): the
 * model calls search with `<tool_call>` JSON and gets `<tool_response>` turns rendered by its
 * chat template; budgets are verl's (the response budget spans all turns, the context is
 * never cut).
 */

export interface AgentSettings {
  maxTurns: number;
  /** The prompt keeps its last this-many tokens. */
  maxStartLength: number;
  /** The engine sees the last this-many tokens of prompt + response. */
  maxPromptLength: number;
  /** Tokens generated per turn at most. */
  maxResponseLength: number;
  /** An observation keeps its first this-many tokens. */
  maxObsLength: number;
  sampling: Sampling;
  compat: "none" | "search-r1-retokenize";
  /** How search is called: Search-R1's tags (absent: those), or Hermes tool calls (verl's tool agent). */
  format?: { kind: "search_r1" } | HermesFormat;
  /** The engine's LoRA adapter every turn runs with (train with LoRA); absent: the base. */
  lora?: string;
}

export interface AgentParts {
  engine: EngineClient;
  retriever: Pick<RetrieverClient, "search">;
  tokenizer: Pick<TextTokenizer, "encode" | "decode">;
  /** The chat template's encoder: the Hermes format renders tool turns with it. */
  chat?: Pick<ModelTokenizer, "encodeChat">;
}

export interface RolloutTask {
  promptIds: readonly number[];
  /** Seeds the engine's sampler for this trajectory; null leaves it unseeded. */
  seed: number | null;
}

export interface RolloutHooks {
  /** After each turn, once its observation is known. */
  onTurn?: (turn: Turn, index: number) => void;
  signal?: AbortSignal;
}

export async function rollout(
  task: RolloutTask,
  settings: AgentSettings,
  parts: AgentParts,
  hooks: RolloutHooks = {},
): Promise<Trajectory> {
  // With several engine replicas (EngineRouter), every turn goes to the one that served the
  // first turn.
  const route = parts.engine.route?.() ?? null;
  try {
    return await turns(task, settings, { ...parts, engine: route ?? parts.engine }, hooks);
  } finally {
    route?.release();
  }
}

async function turns(
  task: RolloutTask,
  settings: AgentSettings,
  parts: Omit<AgentParts, "engine"> & { engine: Pick<EngineClient, "generate"> },
  hooks: RolloutHooks,
): Promise<Trajectory> {
  const started = performance.now();
  const promptIds = task.promptIds.slice(-settings.maxStartLength);
  const trajectory: Trajectory = {
    promptIds,
    responseIds: [],
    lossMask: [],
    logprobs: [],
    turns: [],
    searches: 0,
    invalidActions: 0,
    finishReason: "max_turns",
    promptTruncated: promptIds.length < task.promptIds.length,
    contextTruncations: 0,
    timing: { generateMs: 0, retrieveMs: 0, totalMs: 0 },
  };
  const append = (
    ids: readonly number[],
    mask: 0 | 1,
    logprobs: readonly (number | null)[] | null,
  ) => {
    trajectory.responseIds.push(...ids);
    for (let i = 0; i < ids.length; i++) {
      trajectory.lossMask.push(mask);
      trajectory.logprobs.push(logprobs?.[i] ?? null);
    }
  };

  const hermes = settings.format?.kind === "hermes" ? settings.format : null;
  for (let index = 0; hermes || index <= settings.maxTurns; index++) {
    const finalTurn = index === settings.maxTurns;
    const context = [...promptIds, ...trajectory.responseIds];
    let inputIds = context;
    let maxNewTokens = settings.maxResponseLength;
    if (hermes) {
      // verl: a turn may use what is left of the response budget, within the context budget
      // (its SGLang server's max_new_tokens, clamped to max_model_len).
      maxNewTokens = Math.min(
        settings.maxResponseLength - trajectory.responseIds.length,
        settings.maxPromptLength - context.length,
      );
      if (maxNewTokens <= 0) break;
    } else {
      if (context.length > settings.maxPromptLength) trajectory.contextTruncations++;
      inputIds = context.slice(-settings.maxPromptLength);
    }
    const t0 = performance.now();
    const output = await parts.engine.generate(
      {
        inputIds,
        maxNewTokens,
        sampling: settings.sampling,
        // Hermes turns end at EOS (<|im_end|>), as verl's tool agent asks for no stop strings.
        stop: hermes ? [] : STOP_STRINGS,
        seed: task.seed === null ? null : turnSeed(task.seed, index),
        ...(settings.lora ? { lora: settings.lora } : {}),
      },
      hooks.signal,
    );
    trajectory.timing.generateMs += performance.now() - t0;
    if (output.finish === "abort") {
      throw new ServiceError(
        "the engine aborted a generation (was it shut down or its weights replaced?)",
      );
    }
    let ids = output.outputIds;
    let logprobs = output.logprobs;
    let text = await parts.tokenizer.decode(ids, true);
    if (settings.compat === "search-r1-retokenize") {
      text = cutAtAction(text);
      ids = await parts.tokenizer.encode(text, { addSpecialTokens: false });
      logprobs = null;
    }
    append(ids, 1, logprobs);

    if (hermes) {
      const step = await hermesStep(
        hermes,
        { index, ids, text, finish: output.finish },
        trajectory,
        {
          retriever: parts.retriever,
          tokenizer: parts.tokenizer,
          chat: parts.chat,
          maxResponseLength: settings.maxResponseLength,
        },
      );
      if (step.observationIds) append(step.observationIds, 0, null);
      hooks.onTurn?.(step.turn, index);
      if (!step.observationIds) break;
      continue;
    }
    const action = parseAction(text);
    const turn: Turn = {
      action: action.kind,
      query: action.content,
      text,
      tokens: ids.length,
      finish: output.finish,
      documents: [],
      observation: "",
      observationTruncated: false,
    };
    trajectory.turns.push(turn);
    if (action.kind === "answer") {
      trajectory.finishReason = "answer";
      hooks.onTurn?.(turn, index);
      break;
    }
    if (action.kind === "invalid") trajectory.invalidActions++;
    if (finalTurn) {
      // Search-R1's last generation runs with do_search=False: no documents, nothing appended.
      hooks.onTurn?.(turn, index);
      break;
    }
    let observation = INVALID_ACTION_MESSAGE;
    if (action.kind === "search") {
      const r0 = performance.now();
      turn.documents = await parts.retriever.search(action.content);
      trajectory.timing.retrieveMs += performance.now() - r0;
      trajectory.searches++;
      observation = informationBlock(turn.documents as Passage[]);
    }
    let observationIds = await parts.tokenizer.encode(observation, { addSpecialTokens: false });
    if (observationIds.length > settings.maxObsLength) {
      // Right truncation, as the original (it may cut `</information>` off).
      observationIds = observationIds.slice(0, settings.maxObsLength);
      turn.observationTruncated = true;
    }
    turn.observation = observation;
    append(observationIds, 0, null);
    hooks.onTurn?.(turn, index);
  }
  trajectory.timing.totalMs = performance.now() - started;
  return trajectory;
}

/** A distinct seed per turn of a trajectory, so a seeded rollout is reproducible. */
function turnSeed(seed: number, turn: number): number {
  return (seed + turn * 1_000_003) % 2 ** 31;
}

/**
 * Runs tasks with at most `concurrency` trajectories in flight: each goes back to the
 * engine as soon as its documents arrive (no turn-synchronous batches). Results come back
 * in task order; `onDone` sees each as it finishes.
 */
export async function rolloutAll(
  tasks: readonly RolloutTask[],
  settings: AgentSettings,
  parts: AgentParts,
  options: {
    concurrency: number;
    onDone?: (trajectory: Trajectory, index: number) => void | Promise<void>;
    signal?: AbortSignal;
  },
): Promise<Trajectory[]> {
  const results: Trajectory[] = new Array(tasks.length);
  // The first failure stops the other trajectories' requests too.
  const stop = new AbortController();
  const signal = options.signal ? AbortSignal.any([options.signal, stop.signal]) : stop.signal;
  // Every request in flight listens to it: hundreds at once are expected, not a leak.
  setMaxListeners(0, signal);
  let next = 0;
  const worker = async () => {
    while (next < tasks.length) {
      signal.throwIfAborted();
      const index = next++;
      const trajectory = await rollout(tasks[index] as RolloutTask, settings, parts, { signal });
      results[index] = trajectory;
      await options.onDone?.(trajectory, index);
    }
  };
  const workers = Array.from({ length: Math.min(options.concurrency, tasks.length) }, () =>
    worker().catch((err: unknown) => {
      stop.abort();
      throw err;
    }),
  );
  const settled = await Promise.allSettled(workers);
  // The first real error, not the aborts it caused in the other workers.
  const failed = settled.find(
    (s): s is PromiseRejectedResult =>
      s.status === "rejected" && (s.reason as Error)?.name !== "AbortError",
  );
  if (failed) throw failed.reason;
  const aborted = settled.find((s): s is PromiseRejectedResult => s.status === "rejected");
  if (aborted) throw aborted.reason;
  return results;
}
