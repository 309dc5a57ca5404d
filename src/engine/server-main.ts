import { existsSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import type { ServeEngineConfig } from "../config/schemas/serve-engine.js";
import { CliError, InputError } from "../runtime/errors.js";
import {
  drainOnSignal,
  listenError,
  onStopSignals,
  WILDCARD_HOSTS,
} from "../runtime/http-server.js";
import { findChatTemplate } from "../text/chat-template.js";
import { readTokenizerConfig } from "../text/tokenizer-config.js";
import { Detokenizer } from "./detokenizer.js";
import { type EngineDied, NativeEngine } from "./native-engine.js";
import type { ChatSide } from "./openai/request.js";
import { EngineServer } from "./server.js";

/** Addresses only this machine reaches. */
function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "").toLowerCase();
  return h === "localhost" || h === "::1" || /^127\.\d+\.\d+\.\d+$/.test(h);
}

/**
 * The chat template and special tokens for /v1/chat/completions. A folder whose template
 * cannot be loaded still serves /generate and /v1/completions: chat requests are then
 * answered 400 with the reason.
 */
function chatSide(model: string): ChatSide {
  try {
    const config = readTokenizerConfig(model);
    const template = findChatTemplate(model, config);
    return {
      template,
      specialTokens: config.specialTokens,
      problem: template
        ? null
        : `${model} has no chat template (no chat_template.jinja, and no "chat_template" in ` +
          "its tokenizer_config.json): send prompts to /v1/completions",
    };
  } catch (e) {
    return { template: null, specialTokens: {}, problem: (e as Error).message };
  }
}

/**
 * One --lora entry, as SGLang's --lora-paths takes them (server_args.py): NAME=PATH, a PATH
 * alone (named by itself), or JSON {"lora_name", "lora_path", "pinned"}. The folder must exist.
 */
function parseLoraSpec(spec: string): { spec: string; name: string; path: string } {
  let name: string;
  let path: string;
  if (spec.trimStart().startsWith("{")) {
    let v: unknown;
    try {
      v = JSON.parse(spec);
    } catch (e) {
      throw new InputError(`--lora ${spec}: not valid JSON (${(e as Error).message})`);
    }
    const o = v as { lora_name?: unknown; lora_path?: unknown };
    if (typeof o.lora_name !== "string" || typeof o.lora_path !== "string") {
      throw new InputError(`--lora ${spec}: JSON needs "lora_name" and "lora_path" strings`);
    }
    name = o.lora_name;
    path = o.lora_path;
  } else {
    const eq = spec.indexOf("=");
    name = eq > 0 ? spec.slice(0, eq) : spec;
    path = eq > 0 ? spec.slice(eq + 1) : spec;
  }
  const dir = resolve(path);
  if (!existsSync(dir) || !statSync(dir).isDirectory()) {
    throw new InputError(`--lora ${spec}: ${dir} is not a folder (a PEFT adapter folder)`);
  }
  return { spec, name, path: dir };
}

/**
 * `searchr1 serve-engine`: listens at once (`/health` 503 while loading), starts the native
 * engine, serves until SIGINT/SIGTERM, then drains (requests in flight finish) and shuts the
 * engine down. Resolves on a clean stop; rejects with EngineDied (exit 1) when the engine
 * fails to load or dies while serving, after answering the requests in flight.
 */
export async function serveEngine(
  config: ServeEngineConfig,
  err: (line: string) => void = (line) => process.stderr.write(`${line}\n`),
): Promise<void> {
  const started = performance.now();
  const model = resolve(config.model);
  if (!existsSync(model) || !statSync(model).isDirectory()) {
    throw new InputError(`${model}: no such model folder (--model)`);
  }
  if (!existsSync(join(model, "config.json"))) {
    throw new InputError(`${model}: no config.json; --model must be a Hugging Face model folder`);
  }
  const adapters = config.lora.map(parseLoraSpec);
  const detokenizer = config.skip_tokenizer_init ? null : Detokenizer.load(model);
  const chat = config.skip_tokenizer_init ? null : chatSide(model);

  let server: EngineServer;
  try {
    server = await EngineServer.listen({
      host: config.host,
      port: config.port,
      maxBodyBytes: Math.floor(config.max_body_mb * 2 ** 20),
      modelPath: model,
      settings: {
        max_running: config.max_running,
        kv_cache_mb: config.kv_cache_mb,
        gpu_memory_utilization: config.gpu_memory_utilization,
        enforce_eager: config.enforce_eager,
        threads: config.threads,
        max_body_mb: config.max_body_mb,
        served_model_name: config.served_model_name ?? config.model,
        api_key_required: config.api_key !== null,
      },
      servedModelName: config.served_model_name ?? config.model,
      apiKey: config.api_key,
      log: err,
    });
  } catch (e) {
    throw listenError(e as NodeJS.ErrnoException, config.host, config.port, "another engine");
  }
  if (!isLoopback(config.host) && config.api_key === null) {
    const reach = WILDCARD_HOSTS.has(config.host) ? "from other machines" : "beyond this machine";
    const [first, ...others] = EngineServer.FILE_ROUTES;
    const also = others.length
      ? `, as ${others.join(", ")} ${others.length > 1 ? "do" : "does"}`
      : "";
    err(
      `warning: listening on ${config.host} without --api-key: anyone who reaches it ${reach} ` +
        `can generate, and ${first} reads files from this machine's disk${also}; set ` +
        "--api-key (or SEARCHR1_API_KEY), or use --host 127.0.0.1",
    );
  }
  // A signal while the model loads stops the engine and the command (exit 130); after
  // that, signals drain the server.
  const loading = new AbortController();
  let signalled: NodeJS.Signals | null = null;
  let onSignal: (signal: NodeJS.Signals) => void = (signal) => {
    signalled = signal;
    err(`${signal}: stopping while the model loads`);
    loading.abort();
  };
  const removeSignals = onStopSignals((signal) => onSignal(signal));
  // Announced only once the handlers are in place: a signal sent on seeing this line stops
  // the load cleanly instead of killing the process.
  err(`loading ${model} on ${config.device}; ${server.url}/health answers 503 until it is ready`);

  const engineStart = NativeEngine.start({
    model,
    device: config.device,
    threads: config.threads,
    contextLength: config.context_length,
    kvCacheMb: config.kv_cache_mb,
    gpuMemoryUtilization: config.gpu_memory_utilization,
    maxRunning: config.max_running,
    chunkTokens: config.chunk_tokens,
    enforceEager: config.enforce_eager,
    onLog: (line) => err(`engine: ${line}`),
    signal: loading.signal,
  });
  let engine: NativeEngine;
  try {
    engine = await engineStart;
  } catch (e) {
    removeSignals();
    await server.closeNow();
    if (signalled) throw new CliError(`${signalled} while the model was loading; stopped`, 130);
    throw e;
  }
  if (signalled) {
    // The signal came as the engine became ready.
    removeSignals();
    await server.closeNow();
    await engine.shutdown();
    throw new CliError(`${signalled} while the model was loading; stopped`, 130);
  }
  // The adapters load before /health answers 200; one the engine refuses stops the command.
  for (const a of adapters) {
    const reply = await engine.control({ op: "load_lora", name: a.name, path: a.path });
    if (!reply.ok) {
      removeSignals();
      await server.closeNow();
      await engine.shutdown();
      throw new InputError(`--lora ${a.spec}: ${reply.message ?? "the engine refused it"}`);
    }
    err(`LoRA adapter "${a.name}" loaded from ${a.path}`);
  }
  server.attach(engine, detokenizer, chat, adapters);
  const info = engine.info;
  const seconds = (performance.now() - started) / 1000;
  err(
    `serving ${info.model_path} on ${info.device} at ${server.url} (context ${info.context_length} ` +
      `tokens, KV cache ${info.kv_blocks} blocks of ${info.block_size} tokens, ` +
      `${detokenizer ? "tokenizer.json loaded" : "no tokenizer"}, loaded in ${seconds.toFixed(1)} s)`,
  );

  // A signal drains the server (300 s for requests in flight); a second cuts them, which
  // aborts their sequences.
  const died = await new Promise<EngineDied | null>((resolveStop) => {
    onSignal = drainOnSignal(server, err, () => resolveStop(null));
    engine.onDeath((death) => {
      err("the native engine is gone: answering what is in flight, then stopping");
      // Requests in flight have their 500; the others are cut.
      void server.close(2_000).then(() => resolveStop(death));
    });
  });
  removeSignals();
  if (died) throw died;
  await engine.shutdown();
  err("engine stopped");
}
