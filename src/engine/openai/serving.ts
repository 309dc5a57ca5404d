/**
 * serve-engine's OpenAI-compatible routes: `GET /v1/models`, `POST /v1/completions` and
 * `POST /v1/chat/completions`. Their sequences are the same `Sequence`s on the same engine
 * as `/generate` (../sequence.ts): one continuous batch and one prefix cache for both
 * protocols.
 *
 * `stream: true` answers server-sent events as OpenAI's clients read them (each event a
 * `data: <chunk JSON>` line and a blank line, the last `data: [DONE]`; vLLM's
 * chat_completion/serving.py and completion/serving.py write the same): a chat choice
 * opens with a chunk whose delta is `{"role": "assistant", "content": ""}`, its text
 * follows as it becomes final (../sequence.ts holds back a possible stop string), and its
 * last chunk carries `finish_reason`; with `stream_options.include_usage`, a chunk with no
 * choices and the usage comes before `[DONE]`. Nothing is written until the first token,
 * so a prompt the engine refuses is still answered with a status and an error object;
 * after that an error is an `error` event, then `[DONE]`. A client that disconnects (a
 * stream it stops reading, a request it aborts) aborts its sequences in the engine.
 *
 * With `tools` and `tool_choice` "auto", "required" or a named function (the last two
 * constrained to calls by a grammar, ./request.ts), the text is read for Hermes tool calls
 * (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`, what Qwen2.5's template asks
 * for; ../../text/hermes-tool-calls.ts) into `tool_calls`, and finish_reason "tool_calls";
 * a stream holds its text back from the first `<tool_call>` and sends the calls with the
 * last chunk.
 */
import type { IncomingMessage, OutgoingHttpHeaders, ServerResponse } from "node:http";
import { HttpError, readJsonBody } from "../../runtime/http-server.js";
import { parseHermesToolCalls } from "../../text/hermes-tool-calls.js";
import type { Detokenizer } from "../detokenizer.js";
import { grammarLimit } from "../generate-request.js";
import { EngineRefused, type NativeEngine } from "../native-engine.js";
import type { TopLogprob } from "../protocol.js";
import { type GenerateOutput, Sequence } from "../sequence.js";
import { OpenAIError, openAIErrorBody } from "./errors.js";
import {
  type ChatSide,
  type OpenAIRequest,
  parseChatRequest,
  parseCompletionRequest,
} from "./request.js";
import {
  chatLogprobs,
  completionLogprobs,
  finishOf,
  openAIId,
  type TokenLogprobs,
  type TokenTexts,
  toolCallsOf,
  usageOf,
} from "./responses.js";

export interface OpenAIServingOptions {
  /** The name clients send as `model` (and /v1/models lists). */
  modelName: string;
  /** The model folder (/v1/models' `root`). */
  modelPath: string;
  /** The LoRA adapters loaded, name → folder: a request's `model` may name one. */
  adapters: () => ReadonlyMap<string, string>;
  maxBodyBytes: number;
  /** The engine, or an HttpError 503 while loading / after it died. */
  engine: () => NativeEngine;
  detokenizer: Detokenizer | null;
  chat: ChatSide | null;
  /** A rid no other live sequence has. */
  newRid: () => string;
  /** Writes status and headers (the server adds `Connection: close` while draining). */
  writeHead: (res: ServerResponse, status: number, headers: OutgoingHttpHeaders) => void;
  sendJson: (res: ServerResponse, status: number, value: unknown) => void;
}

type Kind = "completion" | "chat";

const TOOL_CALL_START = "<tool_call>";

export class OpenAIServing {
  private readonly created = Math.floor(Date.now() / 1000);

  constructor(private readonly o: OpenAIServingOptions) {}

  /**
   * `GET /v1/models`: the model served, then each LoRA adapter loaded, as vLLM lists them
   * (vllm/entrypoints/openai/serving_models.py, show_available_models: an adapter's card has
   * its name as `id`, its folder as `root` and the base model as `parent`).
   */
  models(res: ServerResponse): void {
    const engine = this.o.engine();
    const card = (id: string, root: string, parent: string | null) => ({
      id,
      object: "model",
      created: this.created,
      owned_by: "searchr1",
      root,
      parent,
      max_model_len: engine.info.context_length,
    });
    this.o.sendJson(res, 200, {
      object: "list",
      data: [
        card(this.o.modelName, this.o.modelPath, null),
        ...[...this.o.adapters()].map(([name, path]) => card(name, path, this.o.modelName)),
      ],
    });
  }

  completions(req: IncomingMessage, res: ServerResponse): Promise<void> {
    return this.serve(req, res, "completion");
  }

  chat(req: IncomingMessage, res: ServerResponse): Promise<void> {
    return this.serve(req, res, "chat");
  }

  private async serve(req: IncomingMessage, res: ServerResponse, kind: Kind): Promise<void> {
    const body = await readJsonBody(req, this.o.maxBodyBytes, "send fewer prompts per request");
    const engine = this.o.engine();
    const info = engine.info;
    const detokenizer = this.o.detokenizer;
    const ctx = {
      limits: {
        vocabSize: info.vocab_size,
        contextLength: info.context_length,
        tokenizer: detokenizer !== null,
        ...grammarLimit(detokenizer),
      },
      tokenizer: detokenizer?.tokenizer ?? null,
      chat: this.o.chat,
    };
    const request =
      kind === "chat" ? await parseChatRequest(body, ctx) : await parseCompletionRequest(body, ctx);
    // `model` names the base model or a loaded LoRA adapter (vLLM's and SGLang's way).
    const adapters = this.o.adapters();
    const model = request.model ?? this.o.modelName;
    if (model !== this.o.modelName && !adapters.has(model)) {
      const served = [this.o.modelName, ...adapters.keys()].map((m) => `"${m}"`).join(", ");
      throw new OpenAIError(
        404,
        `The model \`${model}\` does not exist; this server serves ${served} (GET /v1/models)`,
        "model",
        "model_not_found",
      );
    }
    if (model !== this.o.modelName) for (const s of request.sequences) s.lora = model;
    const answer = new Answer(this.o, engine, kind, request, res, model);
    await answer.run();
  }
}

/** What one choice of a stream has sent so far. */
interface ChoiceState {
  opened: boolean;
  text: string;
  tokens: number;
}

/** One request being answered: its sequences, and its stream when it streams. */
class Answer {
  private readonly id: string;
  private readonly created = Math.floor(Date.now() / 1000);
  private readonly sequences: Sequence[];
  private readonly choices: ChoiceState[];
  /** Stream writes, in order (each may wait for token texts). */
  private writes: Promise<void> = Promise.resolve();
  private streaming = false;
  /** A sequence failed: the error is the answer's end, nothing more is queued. */
  private failed = false;
  private readonly texts: TokenTexts;
  private readonly eos: number[];

  constructor(
    private readonly o: OpenAIServingOptions,
    engine: NativeEngine,
    private readonly kind: Kind,
    private readonly request: OpenAIRequest,
    private readonly res: ServerResponse,
    private readonly model: string,
  ) {
    this.id = openAIId(kind === "chat" ? "chatcmpl" : "cmpl");
    this.eos = engine.info.eos_token_ids;
    const detokenizer = o.detokenizer;
    this.texts = detokenizer
      ? (ids) => Promise.all(ids.map((id) => detokenizer.decode([id], false)))
      : async (ids) => ids.map((id) => `token_id:${id}`);
    this.choices = request.sequences.map(() => ({ opened: false, text: "", tokens: 0 }));
    this.sequences = request.sequences.map(
      (spec, i) =>
        new Sequence(
          o.newRid(),
          spec,
          engine,
          detokenizer,
          request.stream ? (text, tokens) => this.progress(i, text, tokens) : null,
        ),
    );
  }

  async run(): Promise<void> {
    const res = this.res;
    // The client went away before its answer: the engine stops working for it.
    res.once("close", () => {
      if (!res.writableFinished) for (const s of this.sequences) s.cancel();
    });
    for (const s of this.sequences) s.start();
    let outputs: GenerateOutput[];
    try {
      outputs = await Promise.all(
        this.sequences.map((s, i) =>
          s.result.then((output) => {
            if (this.request.stream) this.queue(() => this.finishChoice(i, output));
            return output;
          }),
        ),
      );
    } catch (err) {
      this.failed = true;
      for (const s of this.sequences) s.cancel();
      const error = refusal(err, this.kind);
      await this.writes;
      if (!this.streaming) throw error;
      this.streamError(error);
      return;
    }
    if (res.destroyed) return;
    const usage = usageOf(this.request.prompts, outputs, this.n);
    if (this.request.stream) {
      this.queue(async () => {
        if (this.request.includeUsage) this.event({ ...this.head(), choices: [], usage });
        this.end();
      });
      await this.writes;
      return;
    }
    const choices = await Promise.all(outputs.map((o, i) => this.choice(i, o)));
    this.o.sendJson(res, 200, {
      ...this.head(kind(this.kind)),
      choices,
      usage,
    });
  }

  private get n(): number {
    return this.sequences.length / this.request.prompts.length;
  }

  private head(object = `${kind(this.kind)}.chunk`) {
    return {
      id: this.id,
      object: this.kind === "completion" ? "text_completion" : object,
      created: this.created,
      model: this.model,
    };
  }

  /** A whole choice of a non-streamed answer. */
  private async choice(i: number, output: GenerateOutput) {
    const spec = this.request.sequences[i]?.params;
    const finish = finishOf(output, this.eos, spec?.stopTokenIds ?? []);
    const ids = output.output_ids;
    const meta = output.meta_info;
    const lp: TokenLogprobs = {
      ids,
      logprobs: (meta.output_token_logprobs ?? []).map(([logprob]) => logprob),
      tops: ids.map((_, t) =>
        (meta.output_top_logprobs?.[t] ?? []).map(([logprob, id]): TopLogprob => [id, logprob]),
      ),
    };
    const extra = this.request.returnTokenIds ? { token_ids: ids } : {};
    if (this.kind === "completion") {
      return {
        index: i,
        text: output.text,
        logprobs: this.request.logprobs ? await completionLogprobs(lp, this.texts, 0) : null,
        ...finish,
        ...extra,
      };
    }
    const { content, calls } = this.toolCalls(output.text);
    return {
      index: i,
      message: {
        role: "assistant",
        content,
        ...(calls.length > 0 ? { tool_calls: toolCallsOf(calls) } : {}),
      },
      logprobs: this.request.logprobs ? { content: await chatLogprobs(lp, this.texts) } : null,
      ...finish,
      ...(calls.length > 0 && finish.finish_reason === "stop"
        ? { finish_reason: "tool_calls" }
        : {}),
      ...extra,
    };
  }

  /** The content and the calls of a chat text (no calls without tools). */
  private toolCalls(text: string): {
    content: string | null;
    calls: ReturnType<typeof parseHermesToolCalls>["calls"];
  } {
    const tools = this.request.tools;
    if (!tools?.parseCalls) return { content: text, calls: [] };
    const parsed = parseHermesToolCalls(text, tools.maxCalls);
    if (parsed.calls.length === 0) return { content: text, calls: [] };
    return { content: parsed.content.trim() === "" ? null : parsed.content, calls: parsed.calls };
  }

  // --- streaming ---

  private queue(write: () => Promise<void> | void): void {
    this.writes = this.writes.then(async () => {
      if (this.failed || this.res.destroyed || this.res.writableEnded) return;
      await write();
    });
  }

  private event(value: unknown): void {
    if (!this.streaming) {
      this.streaming = true;
      this.o.writeHead(this.res, 200, {
        "Content-Type": "text/event-stream; charset=utf-8",
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
      });
    }
    this.res.write(`data: ${JSON.stringify(value)}\n\n`);
  }

  private end(): void {
    if (!this.streaming) this.event({ ...this.head(), choices: [] });
    this.res.end("data: [DONE]\n\n");
  }

  private streamError(err: unknown): void {
    if (this.res.destroyed) return;
    const status = err instanceof HttpError ? err.status : 500;
    const message = err instanceof Error ? err.message : String(err);
    this.event(openAIErrorBody(status, message, err));
    this.end();
  }

  /** The text a stream may send: with tool calls read, none from the first `<tool_call>`. */
  private visible(text: string): string {
    if (!this.request.tools?.parseCalls) return text;
    const at = text.indexOf(TOOL_CALL_START);
    if (at >= 0) return text.slice(0, at);
    // A partial `<tool_call>` at the end may still become one.
    for (let k = Math.min(TOOL_CALL_START.length - 1, text.length); k > 0; k--) {
      if (text.endsWith(TOOL_CALL_START.slice(0, k))) return text.slice(0, -k);
    }
    return text;
  }

  private progress(i: number, text: string, tokens: number): void {
    this.queue(async () => {
      const choice = this.choices[i] as ChoiceState;
      const delta = this.visible(text).slice(choice.text.length);
      if (delta === "") return;
      await this.sendDelta(i, delta, tokens, null);
    });
  }

  /** One chunk of choice i: `delta` text, the log-probs of its tokens up to `tokens`. */
  private async sendDelta(
    i: number,
    delta: string,
    tokens: number,
    last: { finish: ReturnType<typeof finishOf>; calls: ReturnType<typeof toolCallsOf> } | null,
  ): Promise<void> {
    const choice = this.choices[i] as ChoiceState;
    const seq = this.sequences[i] as Sequence;
    const ids = seq.outputIds.slice(choice.tokens, tokens);
    const lp: TokenLogprobs = {
      ids,
      logprobs: seq.outputLogprobs.slice(choice.tokens, tokens),
      tops: seq.outputTopLogprobs.slice(choice.tokens, tokens),
    };
    const offset = choice.text.length;
    choice.text += delta;
    choice.tokens = Math.max(choice.tokens, tokens);
    const finish = last ? last.finish : { finish_reason: null, stop_reason: null };
    const tokenIds = this.request.returnTokenIds ? { token_ids: ids } : {};
    if (this.kind === "completion") {
      this.event({
        ...this.head(),
        choices: [
          {
            index: i,
            text: delta,
            logprobs: this.request.logprobs
              ? await completionLogprobs(lp, this.texts, offset)
              : null,
            ...finish,
            ...tokenIds,
          },
        ],
      });
      return;
    }
    if (!choice.opened) {
      choice.opened = true;
      this.event({
        ...this.head(),
        choices: [
          {
            index: i,
            delta: { role: "assistant", content: "" },
            logprobs: null,
            finish_reason: null,
          },
        ],
      });
    }
    const calls = last?.calls ?? [];
    this.event({
      ...this.head(),
      choices: [
        {
          index: i,
          delta: {
            ...(delta !== "" || calls.length === 0 ? { content: delta } : {}),
            ...(calls.length > 0
              ? { tool_calls: calls.map((call, index) => ({ index, ...call })) }
              : {}),
          },
          logprobs: this.request.logprobs ? { content: await chatLogprobs(lp, this.texts) } : null,
          ...finish,
          ...tokenIds,
        },
      ],
    });
  }

  /** The last chunk of choice i: the rest of its text, its tool calls, why it ended. */
  private async finishChoice(i: number, output: GenerateOutput): Promise<void> {
    const choice = this.choices[i] as ChoiceState;
    const spec = this.request.sequences[i]?.params;
    const finish = finishOf(output, this.eos, spec?.stopTokenIds ?? []);
    let text = output.text;
    let calls: ReturnType<typeof toolCallsOf> = [];
    if (this.kind === "chat") {
      const parsed = this.toolCalls(text);
      text = parsed.content ?? "";
      calls = toolCallsOf(parsed.calls);
      if (calls.length > 0 && finish.finish_reason === "stop") finish.finish_reason = "tool_calls";
    }
    // The text sent so far is a prefix of the final text (held back where it could change).
    const rest = text.startsWith(choice.text) ? text.slice(choice.text.length) : "";
    await this.sendDelta(i, rest, output.output_ids.length, { finish, calls });
  }
}

function kind(k: Kind): string {
  return k === "chat" ? "chat.completion" : "text_completion";
}

/** A refused sequence is the request's fault (400); anything else stays as it is. */
function refusal(err: unknown, k: Kind): unknown {
  if (!(err instanceof EngineRefused)) return err;
  return new OpenAIError(
    400,
    `the engine refused the ${k === "chat" ? "conversation" : "prompt"}: ${err.message}`,
    k === "chat" ? "messages" : "prompt",
  );
}
