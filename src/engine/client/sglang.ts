import { ServiceError } from "../../runtime/errors.js";
import { HttpConnectionError, HttpStatusError, requestJson } from "../../runtime/http-client.js";
import type { EngineClient, TurnOutput, TurnRequest } from "./types.js";

/**
 * SGLang's `POST /generate`, which the native engine (`searchr1 serve-engine`) serves too.
 * Stop strings are kept in the output (`no_stop_trim`): the agent wants every generated
 * token, and reads the action from the text itself.
 */
export class SglangClient implements EngineClient {
  constructor(readonly url: string) {}

  async generate(request: TurnRequest, signal?: AbortSignal): Promise<TurnOutput> {
    const sampling: Record<string, unknown> = {
      max_new_tokens: request.maxNewTokens,
      temperature: request.sampling.temperature,
      top_p: request.sampling.topP,
      top_k: request.sampling.topK,
      stop: request.stop,
      no_stop_trim: true,
    };
    // SGLang's name for the per-request seed (the native engine also takes `seed`).
    if (request.seed !== null) sampling.sampling_seed = request.seed;
    const body = {
      input_ids: request.inputIds,
      sampling_params: sampling,
      return_logprob: true,
      // SGLang's name for the adapter a request runs with (GenerateReqInput.lora_path).
      ...(request.lora ? { lora_path: request.lora } : {}),
    };
    const answer = await callEngine(`${this.url}/generate`, body, signal);
    return parseGenerateAnswer(answer, `${this.url}/generate`);
  }

  /** The engine loads `modelPath` in place; its prefix cache is flushed and its weight version moves on. */
  async updateWeightsFromDisk(modelPath: string): Promise<void> {
    const url = `${this.url}/update_weights_from_disk`;
    const answer = (await callEngine(url, { model_path: modelPath })) as {
      success?: boolean;
      message?: string;
    };
    if (answer?.success !== true) {
      throw new ServiceError(
        `engine ${url} did not load ${modelPath}: ${answer?.message ?? "no reason given"}`,
      );
    }
  }

  /** The engine loads the PEFT adapter folder `path` under `name` (SGLang's LoRAUpdateOutput answer). */
  loadLoraAdapter(name: string, path: string): Promise<void> {
    return this.loraUpdate("load", { lora_name: name, lora_path: path });
  }

  /** The engine drops the adapter `name` (once the requests using it are done). */
  unloadLoraAdapter(name: string): Promise<void> {
    return this.loraUpdate("unload", { lora_name: name });
  }

  private async loraUpdate(which: "load" | "unload", body: Record<string, string>): Promise<void> {
    const url = `${this.url}/${which}_lora_adapter`;
    const answer = (await callEngine(url, body)) as {
      success?: boolean;
      error_message?: string | null;
    } | null;
    if (answer?.success !== true) {
      throw new ServiceError(
        `engine ${url} did not ${which} LoRA adapter "${body.lora_name}": ${answer?.error_message ?? "no reason given"}`,
      );
    }
  }

  /** The engine's KV cache memory goes back to the device; generation waits for resume. */
  releaseMemoryOccupation(): Promise<void> {
    return this.memoryOccupation("release");
  }

  /** The engine takes its KV cache memory again. */
  resumeMemoryOccupation(): Promise<void> {
    return this.memoryOccupation("resume");
  }

  private async memoryOccupation(which: "release" | "resume"): Promise<void> {
    const url = `${this.url}/${which}_memory_occupation`;
    // SGLang answered an empty body before it answered {success, message}.
    const answer = (await callEngine(url, { tags: ["kv_cache"] })) as {
      success?: boolean;
      message?: string;
    } | null;
    if (answer?.success === false) {
      throw new ServiceError(`engine ${url} refused: ${answer.message ?? "no reason given"}`);
    }
  }
}

/** POSTs to an engine; failures become one-line errors that name the engine's URL. */
export async function callEngine(
  url: string,
  body: unknown,
  signal?: AbortSignal,
): Promise<unknown> {
  try {
    return await requestJson(url, body, { signal });
  } catch (err) {
    if (err instanceof HttpStatusError) {
      throw new ServiceError(`engine ${url} refused a request (${err.status}): ${err.detail}`);
    }
    if (err instanceof HttpConnectionError) {
      throw new ServiceError(`engine ${url} is unreachable: ${err.message.slice(url.length + 2)}`);
    }
    throw err;
  }
}

function parseGenerateAnswer(answer: unknown, url: string): TurnOutput {
  const bad = (what: string) => new ServiceError(`engine ${url} answered ${what}`);
  const one = (Array.isArray(answer) ? answer[0] : answer) as {
    output_ids?: unknown;
    meta_info?: {
      finish_reason?: { type?: string; matched?: unknown } | null;
      output_token_logprobs?: unknown;
      weight_version?: unknown;
    };
  };
  if (!one || typeof one !== "object" || !Array.isArray(one.output_ids)) {
    throw bad("without output_ids: is it an SGLang-compatible /generate?");
  }
  const outputIds = one.output_ids as number[];
  const meta = one.meta_info ?? {};
  const finishType = meta.finish_reason?.type;
  const finish =
    finishType === "stop" || finishType === "length" || finishType === "abort" ? finishType : null;
  if (!finish) throw bad(`an unknown finish_reason ${JSON.stringify(meta.finish_reason)}`);
  const matched = meta.finish_reason?.matched;
  let logprobs: number[] | null = null;
  if (Array.isArray(meta.output_token_logprobs)) {
    const triples = meta.output_token_logprobs as [number, number, unknown][];
    if (triples.length !== outputIds.length) {
      throw bad(`${triples.length} log-probs for ${outputIds.length} output tokens`);
    }
    logprobs = triples.map((t) => t[0]);
  }
  return {
    outputIds,
    logprobs,
    finish,
    matched: typeof matched === "string" || typeof matched === "number" ? matched : null,
    weightVersion: meta.weight_version == null ? null : String(meta.weight_version),
  };
}
