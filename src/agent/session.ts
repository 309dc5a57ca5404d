import { setMaxListeners } from "node:events";
import { resolve } from "node:path";
import type { z } from "zod";
import { serverLine } from "../config/command-line.js";
import { serveRetrieverSpec } from "../config/schemas/serve-retriever.js";
import type { generationFields, lengthFields, retrieverSection } from "../config/schemas/shared.js";
import {
  type ConnectedEngine,
  connectEngine,
  type EngineChoice,
} from "../engine/client/connect.js";
import type { EngineClient } from "../engine/client/types.js";
import { ChildServer, type CommandLine } from "../runtime/child-server.js";
import { InputError, ServiceError, UsageError } from "../runtime/errors.js";
import { RetrieverClient, type RetrieverSettings } from "./retriever-client.js";
import type { AgentParts, AgentSettings } from "./rollout.js";
import { loadToolConfig, SEARCH_TOOL } from "./tool-config.js";

type Lengths = { [K in keyof typeof lengthFields]: z.infer<(typeof lengthFields)[K]> };
type Generation = { [K in keyof typeof generationFields]: z.infer<(typeof generationFields)[K]> };

/** The config sections the agent reads (shared by eval, ask and train). */
export interface AgentConfig {
  data: Lengths;
  rollout: Generation;
  /** train may name an index to serve instead of a URL. */
  retriever: z.infer<typeof retrieverSection> & {
    index?: string | null;
    corpus?: string | null;
    kind?: "bm25" | "e5" | "bge";
    model?: string | null;
  } /** eval's and train's scoring switches, refused with the Hermes format. */;
  reward?: { format_reward?: boolean; search_r1_extract?: boolean };
}

/**
 * The turn budgets and the action format of a config; sampling as given (temperature 0 =
 * greedy). A Hermes format's tools come from rollout.multi_turn.tool_config_path (a verl
 * tool_config file) or are the built-in search tool.
 */
export function agentSettings(
  config: AgentConfig,
  sampling: AgentSettings["sampling"],
): AgentSettings {
  const mt = config.rollout.multi_turn;
  if (mt.format === "hermes" && config.rollout.compat !== "none") {
    throw new UsageError(
      `rollout.compat=${config.rollout.compat} re-encodes Search-R1's tag turns; it does not apply to rollout.multi_turn.format=hermes`,
    );
  }
  // Hermes runs are scored as verl scores its recipe (search_r1_like_qa_em): exact match only.
  for (const key of ["format_reward", "search_r1_extract"] as const) {
    if (mt.format === "hermes" && config.reward?.[key]) {
      throw new UsageError(
        `reward.${key}=true judges Search-R1's tags; rollout.multi_turn.format=hermes is scored as verl's search_r1_like_qa_em (exact match): set reward.${key}=false`,
      );
    }
  }
  return {
    maxTurns: config.rollout.max_turns,
    maxStartLength: config.data.max_start_length,
    maxPromptLength: config.data.max_prompt_length,
    maxResponseLength: config.data.max_response_length,
    maxObsLength: config.data.max_obs_length,
    sampling,
    compat: config.rollout.compat,
    format:
      mt.format === "hermes"
        ? {
            kind: "hermes",
            tools: mt.tool_config_path ? loadToolConfig(mt.tool_config_path) : [SEARCH_TOOL],
            maxAssistantTurns: mt.max_assistant_turns,
            maxParallelCalls: mt.max_parallel_calls,
            maxToolResponseLength: mt.max_tool_response_length,
            truncateSide: mt.tool_response_truncate_side,
          }
        : { kind: "search_r1" },
  };
}

/** The serve-retriever command line when the config names an index (train's retriever.index). */
export function retrieverChildLine(retriever: AgentConfig["retriever"]): CommandLine | null {
  const { index, corpus, kind, model, topk } = retriever;
  if (!index) return null;
  return serverLine(serveRetrieverSpec, {
    retriever: kind,
    index,
    corpus: corpus || undefined,
    retriever_model: model || undefined,
    topk,
  });
}

/**
 * `train --gpus N`'s engine: N native replicas (per node, with `nodes`), replica r seeing only
 * `devices[r]` (null: CPU replicas), on `device` (the rollout's engine_device with auto
 * resolved); absent: one.
 */
export type EngineReplicas = Pick<EngineChoice, "replicas" | "devices" | "nodes"> & {
  device?: "cpu" | "cuda";
};

/** What the native engine started for a run is told besides its model. */
export function engineChildValues(rollout: Generation): EngineChoice["child"] {
  return {
    device: rollout.engine_device,
    threads: rollout.engine_threads || undefined,
    gpu_memory_utilization: rollout.gpu_memory_utilization,
    enforce_eager: rollout.enforce_eager,
  };
}

/**
 * The engine (a running one, or the native engine started as a child: one, or with
 * `train --gpus N` one replica per device behind an EngineRouter; eval and ask keep one) and
 * the retriever client of one command. `signal` aborts when a child engine dies; `failure()`
 * then says why in the engine's own words (naming the replica), which beats the refused
 * sockets the requests see.
 */
export class AgentSession {
  private died: string | null = null;
  /** The adapter useAdapter loaded into an engine this session did not start. */
  private loaded: string | null = null;
  private readonly stop = new AbortController();
  private readonly interrupt: AbortSignal;
  readonly signal: AbortSignal;
  readonly retriever: RetrieverClient;

  private constructor(
    private readonly connected: ConnectedEngine,
    private readonly retrieverChild: ChildServer | null,
    retriever: RetrieverSettings,
    signal: AbortSignal,
  ) {
    this.interrupt = signal;
    this.signal = AbortSignal.any([signal, this.stop.signal]);
    // A retriever that died ends its requests and their retries with the session.
    this.retriever = new RetrieverClient({ ...retriever, signal: this.signal });
    // One listener per request in flight: hundreds at once are expected, not a leak.
    setMaxListeners(0, this.signal, signal);
    for (const child of [...connected.children, retrieverChild]) {
      child?.onDeath((message) => this.fail(message));
    }
  }

  /** Stops the work in flight; `failure()` will report `message`. */
  fail(message: string): void {
    this.died ??= message;
    this.stop.abort();
  }

  get engine(): EngineClient {
    return this.connected.client;
  }

  /** Whether the engine is the native one this session started (not one at engine_url). */
  get startedEngine(): boolean {
    return this.connected.children.length > 0;
  }

  static async open(
    config: AgentConfig,
    modelPath: string,
    log: (line: string) => void,
    signal: AbortSignal,
    replicas: EngineReplicas = {},
  ): Promise<AgentSession> {
    const { rollout } = config;
    if (rollout.tensor_parallel_size > 1) {
      throw new UsageError(
        `rollout.tensor_parallel_size=${rollout.tensor_parallel_size}: the native engine runs ` +
          "a model on one device (no tensor parallelism); for an SGLang or vLLM server given " +
          "in rollout.engine_url, set its tensor parallelism on the server and leave this at 1",
      );
    }
    const retrieverLine = retrieverChildLine(config.retriever);
    const retrieverChild = retrieverLine
      ? await ChildServer.start("retriever", retrieverLine, { signal })
      : null;
    const engine = await connectEngine(
      {
        kind: rollout.engine,
        url: rollout.engine_url,
        modelPath,
        child: {
          ...engineChildValues(rollout),
          ...(replicas.device && { device: replicas.device }),
        },
        replicas: replicas.replicas,
        devices: replicas.devices,
        nodes: replicas.nodes,
      },
      { signal },
    );
    if (engine.children.length > 1) {
      engine.children.forEach((child, r) => {
        const device = replicas.devices?.[r];
        const node = replicas.nodes?.node(r);
        log(
          `engine replica ${r} serving at ${child.url}` +
            (node === undefined ? "" : ` on node ${node}`) +
            (device === undefined ? "" : ` (CUDA_VISIBLE_DEVICES=${device})`),
        );
      });
    }
    const retriever: RetrieverSettings = {
      url: retrieverChild ? `${retrieverChild.url}` : config.retriever.url,
      topk: config.retriever.topk,
      timeoutMs: config.retriever.timeout_s * 1000,
      maxRetries: config.retriever.max_retries,
      onRetry: log,
    };
    return new AgentSession(engine, retrieverChild, retriever, signal);
  }

  /**
   * Serves the PEFT adapter folder `path` (eval's and ask's model.lora_adapter_path) over the
   * model: loaded into the engine by SGLang's /load_lora_adapter, which the native engine
   * speaks too, under a name of this process; returns the name rollouts ask for
   * (AgentSettings.lora). An engine started here goes with the session; one at engine_url
   * has the adapter unloaded by close().
   */
  async useAdapter(path: string): Promise<string> {
    const engine = this.connected.client;
    if (!engine.loadLoraAdapter) {
      throw new UsageError(
        `model.lora_adapter_path=${path}: this engine's client cannot load adapters (the native engine and SGLang's can); serve the merged model instead (searchr1 convert peft-to-hf)`,
      );
    }
    const name = `searchr1-adapter-${process.pid}`;
    try {
      await engine.loadLoraAdapter(name, resolve(path));
    } catch (err) {
      throw new InputError(`model.lora_adapter_path=${path}: ${(err as Error).message}`);
    }
    if (!this.startedEngine) this.loaded = name;
    return name;
  }

  /** The parts of a rollout: `chat` (the model's template) renders Hermes tool turns. */
  parts(tokenizer: AgentParts["tokenizer"], chat?: AgentParts["chat"]): AgentParts {
    return {
      engine: this.connected.client,
      retriever: this.retriever,
      tokenizer,
      ...(chat && { chat }),
    };
  }

  /**
   * The error to report for `err`: a child's death when that is what happened. A request can
   * fail on the socket a dying child hung up a moment before its exit is seen, so a child
   * still running gets up to a second to be reported in its own words (not after Ctrl-C).
   */
  async failure(err: unknown): Promise<unknown> {
    if (!this.died && !this.interrupt.aborted) {
      await Promise.all(
        [...this.connected.children, this.retrieverChild].map((child) => child?.settle(1000)),
      );
    }
    return this.died ? new ServiceError(this.died) : err;
  }

  /** Stops the children this session started, and unloads the adapter it loaded elsewhere. */
  async close(): Promise<void> {
    const unload = this.loaded ? this.connected.client.unloadLoraAdapter?.(this.loaded) : null;
    this.loaded = null;
    await Promise.all([
      unload?.catch(() => {}), // the adapter stays loaded on a server that went away: no harm
      this.connected.stop(),
      this.retrieverChild?.stop(),
    ]);
  }
}
