/**
 * The HTTP side of `searchr1 serve-engine`: SGLang's `/generate` protocol (the subset RL
 * code uses) and its control routes, in front of the native engine process.
 *
 * Built on `node:http` as the retrieval server is (src/retrieval/server.ts), and on the same
 * server shell (JsonHttpServer, src/runtime/http-server.ts), for the same reasons: body
 * limits (413, and the connection lives on), keep-alive longer than clients' pools, and
 * draining on SIGTERM (stop accepting, let requests in flight finish, close idle
 * connections). The server listens before the model is loaded: `/health` answers 503 until
 * the engine is ready, and every other route answers 503 too.
 *
 * A client that disconnects before its answer aborts its sequences in the engine. When the
 * engine dies, the requests in flight get 500 and later ones 503, naming the engine and the
 * last lines of its stderr.
 *
 * OpenAI's API (`/v1/models`, `/v1/completions`, `/v1/chat/completions`: ./openai/) runs
 * its sequences on the same engine; errors on `/v1/` paths are answered in OpenAI's shape.
 *
 * LoRA adapters (PEFT folders) are loaded and unloaded by name as SGLang does
 * (`/load_lora_adapter`, `/unload_lora_adapter`); `/generate`'s `lora_path` and the OpenAI
 * routes' `model` name the adapter a request runs with, which the engine applies unmerged.
 * With an API key, every route but `/health` needs `Authorization: Bearer <key>` (vLLM's
 * `--api-key`); anything else is a 401 in OpenAI's shape.
 */
import { existsSync, statSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { join, resolve } from "node:path";
import {
  HttpError,
  JsonHttpServer,
  pathOf,
  readBody,
  readJsonBody,
  typeOf,
} from "../runtime/http-server.js";
import { packageVersion } from "../runtime/package-root.js";
import { ApiKey } from "./api-key.js";
import type { Detokenizer } from "./detokenizer.js";
import { grammarLimit, parseGenerateRequest } from "./generate-request.js";
import { parseLoadLoraRequest, parseUnloadLoraRequest } from "./lora-request.js";
import { EngineDied, EngineRefused, type NativeEngine } from "./native-engine.js";
import { openAIErrorBody } from "./openai/errors.js";
import type { ChatSide } from "./openai/request.js";
import { OpenAIServing } from "./openai/serving.js";
import type { ControlCommand, EngineStats, LoraReply } from "./protocol.js";
import { type GenerateOutput, Sequence } from "./sequence.js";
import { prometheusText, stateFields } from "./stats.js";

export interface EngineServerOptions {
  host: string;
  /** 0 = any free port (read it back from `port`). */
  port: number;
  /** Largest request body in bytes (more: 413). */
  maxBodyBytes: number;
  /** The model folder being loaded (as given). */
  modelPath: string;
  /** Launch settings shown by /get_server_info. */
  settings: Record<string, unknown>;
  /** The name OpenAI clients send as `model`. */
  servedModelName: string;
  /** Required as `Authorization: Bearer <key>` on every route but /health; null: none. */
  apiKey: string | null;
  /** Where unexpected failures are reported; default stderr. */
  log?: (line: string) => void;
}

type Route = (req: IncomingMessage, res: ServerResponse) => Promise<void>;

/**
 * `url` is `http://host:port`; `close()` gives requests in flight 300 s, and a connection
 * cut after that (or by `closeNow`) aborts its sequences in the engine.
 */
export class EngineServer extends JsonHttpServer {
  private engine: NativeEngine | null = null;
  private detokenizer: Detokenizer | null = null;
  private openai: OpenAIServing | null = null;
  private readonly apiKey: ApiKey | null;
  private nextRid = 1;
  /** Weight updates run one at a time. */
  private updating: Promise<unknown> = Promise.resolve();
  private readonly answered: Record<string, number> = {};
  /** The LoRA adapters the engine holds, name → folder (from its last reply). */
  private loras: ReadonlyMap<string, string> = new Map();
  private readonly routes: Record<string, { methods: string[]; run: Route }>;

  private constructor(private readonly options: EngineServerOptions) {
    super({
      name: "serve-engine",
      host: options.host,
      port: options.port,
      urlPath: "",
      // Generation can take long: no limit on how long an answer takes.
      requestTimeoutMs: 0,
      graceMs: 300_000,
      log: options.log,
    });
    this.apiKey = options.apiKey === null ? null : new ApiKey(options.apiKey);
    const get = ["GET", "HEAD"];
    this.routes = {
      "/v1/models": { methods: get, run: async (_, s) => this.openAI().models(s) },
      "/v1/completions": { methods: ["POST"], run: (q, s) => this.openAI().completions(q, s) },
      "/v1/chat/completions": { methods: ["POST"], run: (q, s) => this.openAI().chat(q, s) },
      "/generate": { methods: ["POST", "PUT"], run: (q, s) => this.generate(q, s) },
      "/health": { methods: get, run: async (_, s) => this.health(s) },
      "/get_model_info": { methods: get, run: async (_, s) => this.modelInfo(s) },
      "/get_server_info": { methods: get, run: (_, s) => this.serverInfo(s) },
      "/get_weight_version": { methods: get, run: async (_, s) => this.weightVersion(s) },
      "/metrics": { methods: get, run: (_, s) => this.metrics(s) },
      "/flush_cache": { methods: ["GET", "POST"], run: (_, s) => this.flushCache(s) },
      "/update_weights_from_disk": { methods: ["POST"], run: (q, s) => this.updateWeights(q, s) },
      "/load_lora_adapter": { methods: ["POST"], run: (q, s) => this.loadLora(q, s) },
      "/unload_lora_adapter": { methods: ["POST"], run: (q, s) => this.unloadLora(q, s) },
      "/release_memory_occupation": {
        methods: ["GET", "POST"],
        run: (q, s) => this.memoryOccupation(q, s, "release_memory"),
      },
      "/resume_memory_occupation": {
        methods: ["GET", "POST"],
        run: (q, s) => this.memoryOccupation(q, s, "resume_memory"),
      },
    };
  }

  /** Starts listening; rejects with the listen error (EADDRINUSE, EACCES, ...). */
  static async listen(options: EngineServerOptions): Promise<EngineServer> {
    const s = new EngineServer(options);
    await s.start();
    return s;
  }

  /** Routes that read files from the server's disk (a key matters most for them). */
  static readonly FILE_ROUTES = ["/update_weights_from_disk", "/load_lora_adapter"];

  /**
   * The engine is ready: serve generation with it, decode text with the tokenizer, and
   * render chats with the model's chat template (`chat` null with --skip-tokenizer-init).
   */
  attach(
    engine: NativeEngine,
    detokenizer: Detokenizer | null,
    chat: ChatSide | null,
    adapters: readonly { name: string; path: string }[] = [],
  ): void {
    this.engine = engine;
    this.loras = new Map(adapters.map((a) => [a.name, a.path]));
    this.detokenizer = detokenizer;
    this.openai = new OpenAIServing({
      modelName: this.options.servedModelName,
      modelPath: this.options.modelPath,
      maxBodyBytes: this.options.maxBodyBytes,
      adapters: () => this.loras,
      engine: () => this.ready(),
      detokenizer,
      chat,
      newRid: () => String(this.nextRid++),
      writeHead: (res, status, headers) => this.writeHead(res, status, headers),
      sendJson: (res, status, value) => this.sendJson(res, status, value),
    });
  }

  /** The OpenAI routes, or 503 while the engine loads. */
  private openAI(): OpenAIServing {
    this.ready();
    return this.openai as OpenAIServing;
  }

  protected async route(req: IncomingMessage, res: ServerResponse, path: string): Promise<void> {
    if (this.apiKey && path !== "/health") this.apiKey.check(req);
    if (path === "/generate") {
      res.once("close", () => {
        const code = res.headersSent ? `${Math.floor(res.statusCode / 100)}xx` : "none";
        this.answered[code] = (this.answered[code] ?? 0) + 1;
      });
    }
    const route = this.routes[path];
    if (!route) {
      throw new HttpError(
        404,
        `no route ${req.method} ${path}; this server answers ${Object.keys(this.routes).join(", ")}`,
      );
    }
    if (!route.methods.includes(req.method ?? "")) {
      const allow = route.methods.join(", ");
      throw new HttpError(405, `${req.method} ${path}: use ${allow}`, { Allow: allow });
    }
    return route.run(req, res);
  }

  /** The engine, or 503 while loading and after it died. */
  private ready(): NativeEngine {
    const engine = this.engine;
    if (!engine) {
      throw new HttpError(
        503,
        `the engine is still loading ${this.options.modelPath}; /health answers 200 when it is ready`,
        { "Retry-After": "5" },
      );
    }
    if (engine.dead) throw new HttpError(503, engine.dead.message);
    return engine;
  }

  private health(res: ServerResponse): void {
    const engine = this.engine;
    const notReady = (status: string, message: string) =>
      this.sendError(res, 503, message, { status, ready: false });
    if (this.closing) notReady("closing", "the server is shutting down");
    else if (!engine) notReady("loading", `loading ${this.options.modelPath}`);
    else if (engine.dead) notReady("dead", engine.dead.message);
    else {
      this.sendJson(res, 200, {
        status: "ok",
        ready: true,
        model_path: engine.info.model_path,
        weight_version: engine.weightVersion,
      });
    }
  }

  private modelInfo(res: ServerResponse): void {
    const engine = this.ready();
    const info = engine.info;
    this.sendJson(res, 200, {
      model_path: info.model_path,
      tokenizer_path: this.detokenizer?.path ?? null,
      is_generation: true,
      vocab_size: info.vocab_size,
      context_length: info.context_length,
      eos_token_ids: info.eos_token_ids,
      weight_version: engine.weightVersion,
    });
  }

  private weightVersion(res: ServerResponse): void {
    this.sendJson(res, 200, { weight_version: this.ready().weightVersion });
  }

  private async stats(engine: NativeEngine): Promise<EngineStats> {
    const reply = await engine.control({ op: "stats" });
    if (!reply.ok) throw new Error(`the engine refused stats: ${reply.message ?? "no message"}`);
    return reply as unknown as EngineStats;
  }

  private async serverInfo(res: ServerResponse): Promise<void> {
    const engine = this.ready();
    const info = engine.info;
    const state = stateFields({
      engine: await this.stats(engine),
      tokensPerSecond: engine.throughput(),
      httpInFlight: this.inFlight,
      generateRequests: this.answered,
    });
    this.sendJson(res, 200, {
      version: packageVersion(),
      engine: "searchr1-engine",
      engine_pid: engine.pid ?? null,
      model_path: info.model_path,
      tokenizer_path: this.detokenizer?.path ?? null,
      skip_tokenizer_init: this.detokenizer === null,
      device: info.device,
      vocab_size: info.vocab_size,
      context_length: info.context_length,
      block_size: info.block_size,
      kv_blocks: info.kv_blocks,
      eos_token_ids: info.eos_token_ids,
      chunk_tokens: info.chunk_tokens,
      cuda_graphs: info.graphs,
      ...this.options.settings,
      http_requests_in_flight: this.inFlight,
      ...state,
      // SGLang's field for the same figures.
      internal_states: [state],
    });
  }

  private async metrics(res: ServerResponse): Promise<void> {
    const engine = this.ready();
    const text = prometheusText({
      engine: await this.stats(engine),
      tokensPerSecond: engine.throughput(),
      httpInFlight: this.inFlight,
      generateRequests: this.answered,
    });
    this.writeHead(res, 200, {
      "Content-Type": "text/plain; version=0.0.4; charset=utf-8",
      "Content-Length": Buffer.byteLength(text),
    });
    res.end(text);
  }

  private async flushCache(res: ServerResponse): Promise<void> {
    const reply = await this.ready().control({ op: "flush_cache" });
    if (!reply.ok) {
      const message = `cache not flushed: ${reply.message ?? "refused by the engine"}`;
      return this.sendError(res, 400, message, { success: false, message });
    }
    this.sendJson(res, 200, { success: true, message: "cache flushed" });
  }

  /**
   * SGLang's `/release_memory_occupation` and `/resume_memory_occupation`, for the KV cache:
   * the engine gives its memory back to the device while a trainer on the same GPU works,
   * then takes it again (`tags`, when given, may name only "kv_cache": the weights stay).
   * While released, `/generate` is refused. Serialized with weight updates.
   */
  private async memoryOccupation(
    req: IncomingMessage,
    res: ServerResponse,
    op: "release_memory" | "resume_memory",
  ): Promise<void> {
    const raw = (await readBody(req, this.options.maxBodyBytes, "send a smaller body")).toString(
      "utf8",
    );
    parseMemoryRequest(raw);
    const engine = this.ready();
    const run = this.updating.then(() => engine.control({ op }));
    this.updating = run.catch(() => {});
    const reply = await run;
    const message = reply.message ?? (reply.ok ? "done" : "the engine refused");
    if (!reply.ok) return this.sendError(res, 400, message, { success: false, message });
    this.log(
      op === "release_memory"
        ? "KV cache released: its memory is the device's until /resume_memory_occupation"
        : "KV cache resumed",
    );
    this.sendJson(res, 200, { success: true, message });
  }

  private async updateWeights(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = await readJsonBody(req, this.options.maxBodyBytes, "send a smaller body");
    const engine = this.ready();
    const { modelPath, abortAll } = parseUpdateRequest(body);
    const run = this.updating.then(() =>
      engine.control({ op: "update_weights", model_path: modelPath, abort_all: abortAll }),
    );
    this.updating = run.catch(() => {});
    const reply = await run;
    const message = reply.message ?? (reply.ok ? "weights updated" : "the engine refused");
    if (!reply.ok) {
      return this.sendError(res, 400, `weights not updated: ${message}`, {
        success: false,
        message,
        num_paused_requests: 0,
      });
    }
    this.sendJson(res, 200, {
      success: true,
      message,
      num_paused_requests: reply.num_paused_requests,
      weight_version: engine.weightVersion,
    });
  }

  /** A LoRA command, serialized with weight updates; the adapters' list follows its reply. */
  private async loraCommand(
    command: Extract<ControlCommand, { op: "load_lora" | "unload_lora" }>,
  ): Promise<LoraReply> {
    const engine = this.ready();
    const run = this.updating.then(() => engine.control(command));
    this.updating = run.catch(() => {});
    const reply = (await run) as LoraReply;
    if (reply.adapters && typeof reply.adapters === "object") {
      this.loras = new Map(Object.entries(reply.adapters));
    }
    return reply;
  }

  /**
   * SGLang's `POST /load_lora_adapter` and `/unload_lora_adapter` (LoadLoRAAdapterReqInput,
   * UnloadLoRAAdapterReqInput): answered with its LoRAUpdateOutput, `{success, error_message,
   * loaded_adapters}` (name → folder), 400 when refused.
   */
  private async loadLora(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = await readJsonBody(req, this.options.maxBodyBytes, "send a smaller body");
    this.ready();
    const { name, path } = parseLoadLoraRequest(body);
    const reply = await this.loraCommand({ op: "load_lora", name, path });
    if (reply.ok) this.log(`LoRA adapter "${name}" loaded from ${path}`);
    this.loraAnswer(res, reply);
  }

  private async unloadLora(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = await readJsonBody(req, this.options.maxBodyBytes, "send a smaller body");
    this.ready();
    const { name } = parseUnloadLoraRequest(body);
    const reply = await this.loraCommand({ op: "unload_lora", name });
    if (reply.ok) this.log(`LoRA adapter "${name}" unloaded`);
    this.loraAnswer(res, reply);
  }

  private loraAnswer(res: ServerResponse, reply: LoraReply): void {
    const loaded = Object.fromEntries(this.loras);
    if (!reply.ok) {
      const message = reply.message ?? "the engine refused";
      this.sendError(res, 400, message, {
        success: false,
        error_message: message,
        loaded_adapters: loaded,
      });
      return;
    }
    this.sendJson(res, 200, { success: true, error_message: null, loaded_adapters: loaded });
  }

  private async generate(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = await readJsonBody(
      req,
      this.options.maxBodyBytes,
      "send fewer prompts per request",
    );
    const engine = this.ready();
    const info = engine.info;
    const request = parseGenerateRequest(body, {
      vocabSize: info.vocab_size,
      contextLength: info.context_length,
      tokenizer: this.detokenizer !== null,
      loras: [...this.loras.keys()],
      ...grammarLimit(this.detokenizer),
    });
    const sequences = request.sequences.map(
      (spec) => new Sequence(String(this.nextRid++), spec, engine, this.detokenizer),
    );
    // The client went away before its answer: the engine stops working for it.
    const onClose = () => {
      if (!res.writableFinished) for (const s of sequences) s.cancel();
    };
    res.once("close", onClose);
    let outputs: GenerateOutput[];
    try {
      for (const s of sequences) s.start();
      outputs = await Promise.all(sequences.map((s) => s.result));
    } catch (err) {
      for (const s of sequences) s.cancel();
      throw generateError(err, sequences, request.batch);
    }
    if (res.destroyed) return;
    this.sendJson(res, 200, request.single ? outputs[0] : outputs);
  }

  /** The error shape of every route: `{"error": message}` (plus route-specific fields). */
  private sendError(
    res: ServerResponse,
    status: number,
    message: string,
    fields: Record<string, unknown> = {},
    headers: Record<string, string> = {},
  ): void {
    this.sendJson(res, status, { error: message, ...fields }, headers);
  }

  /** OpenAI's error shape on its routes (`/v1/...`) and for a missing or wrong key. */
  protected override errorBody(
    req: IncomingMessage,
    status: number,
    message: string,
    err: unknown,
  ): unknown {
    const openai = pathOf(req.url).startsWith("/v1/") || status === 401;
    return openai
      ? openAIErrorBody(status, message, err)
      : super.errorBody(req, status, message, err);
  }

  /** A dead engine is answered 500 with its message (not logged as an internal error). */
  protected override serverError(err: unknown): string {
    return err instanceof EngineDied ? err.message : super.serverError(err);
  }
}

/** What a failed sequence means for its request: 400 for a refusal, 500 for a dead engine. */
function generateError(err: unknown, sequences: Sequence[], batch: boolean): unknown {
  if (!(err instanceof EngineRefused)) return err;
  const failed = sequences.find((s) => s.refusal === err);
  const input = failed && batch ? `"input_ids[${failed.spec.input}]"` : '"input_ids"';
  const which = failed ? `${input} (sample ${failed.spec.sample})` : input;
  return new HttpError(400, `the engine refused ${which}: ${err.message}`);
}

/**
 * The body of `/release_memory_occupation` and `/resume_memory_occupation` (SGLang's
 * Release/ResumeMemoryOccupationReqInput): empty, `{}`, or `{"tags": ["kv_cache"]}`.
 */
function parseMemoryRequest(raw: string): void {
  if (raw.trim() === "") return;
  let body: unknown;
  try {
    body = JSON.parse(raw);
  } catch (err) {
    throw new HttpError(400, `request body is not valid JSON (${(err as Error).message})`);
  }
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    throw new HttpError(400, `request body must be a JSON object like {"tags": ["kv_cache"]}`);
  }
  for (const [key, value] of Object.entries(body)) {
    if (key !== "tags") throw new HttpError(400, `"${key}" is not a known key; known keys: tags`);
    if (value === null) continue;
    if (!Array.isArray(value) || value.some((t) => t !== "kv_cache")) {
      throw new HttpError(
        400,
        `"tags" = ${JSON.stringify(value)}: this engine releases and resumes only its KV cache ` +
          '(["kv_cache"], or null); its weights stay loaded',
      );
    }
  }
}

/** `POST /update_weights_from_disk`, SGLang's UpdateWeightFromDiskReqInput. */
function parseUpdateRequest(body: unknown): { modelPath: string; abortAll: boolean } {
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    throw new HttpError(
      400,
      `request body must be a JSON object like {"model_path": "/path/to/hf-folder"}, got ${typeOf(body)}`,
    );
  }
  const b = body as Record<string, unknown>;
  // Accepted only at these values (null always): this engine always flushes the prefix
  // cache, numbers weight versions itself, and loads synchronously.
  const neutral: Record<string, unknown> = {
    load_format: "auto",
    flush_cache: true,
    weight_version: null,
    is_async: false,
    keep_pause: false,
    torch_empty_cache: undefined,
    recapture_cuda_graph: undefined,
  };
  for (const [key, value] of Object.entries(b)) {
    if (key === "model_path" || key === "abort_all_requests") continue;
    if (!(key in neutral)) {
      throw new HttpError(
        400,
        `"${key}" is not a known key; known keys: model_path, abort_all_requests, ${Object.keys(neutral).join(", ")}`,
      );
    }
    const want = neutral[key];
    if (value !== null && want !== undefined && value !== want) {
      throw new HttpError(
        400,
        `"${key}" = ${JSON.stringify(value)} is not supported by this engine (only ${JSON.stringify(want)} or null)`,
      );
    }
    if (want === undefined && value !== null && typeof value !== "boolean") {
      throw new HttpError(400, `"${key}" must be true or false, got ${typeOf(value)}`);
    }
  }
  if (typeof b.model_path !== "string" || b.model_path === "") {
    throw new HttpError(
      400,
      `"model_path" is required: the Hugging Face model folder to load, got ${typeOf(b.model_path)}`,
    );
  }
  const modelPath = resolve(b.model_path);
  if (!existsSync(modelPath) || !statSync(modelPath).isDirectory()) {
    throw new HttpError(400, `"model_path": ${modelPath} is not a folder on the server`);
  }
  if (!existsSync(join(modelPath, "config.json"))) {
    throw new HttpError(
      400,
      `"model_path": ${modelPath} has no config.json (not a Hugging Face model folder)`,
    );
  }
  const abort = b.abort_all_requests;
  if (abort !== undefined && abort !== null && typeof abort !== "boolean") {
    throw new HttpError(400, `"abort_all_requests" must be true or false, got ${typeOf(abort)}`);
  }
  return { modelPath, abortAll: abort === true };
}
