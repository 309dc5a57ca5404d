import { ServiceError } from "../../runtime/errors.js";
import { callEngine } from "./sglang.js";
import type { EngineClient, TurnOutput, TurnRequest } from "./types.js";

/**
 * A vLLM OpenAI-compatible server (`vllm serve`, v0.10.2 or later for `return_token_ids`),
 * or serve-engine's OpenAI API: `POST /v1/completions` with the prompt as token ids. Its log-probs are what the server's
 * `--logprobs-mode` says (raw, before temperature, by default; start it with
 * `--logprobs-mode processed_logprobs` to get the same quantity as the native engine).
 */
export class VllmClient implements EngineClient {
  private model: Promise<string> | null = null;

  constructor(readonly url: string) {}

  async generate(request: TurnRequest, signal?: AbortSignal): Promise<TurnOutput> {
    const url = `${this.url}/v1/completions`;
    const body: Record<string, unknown> = {
      // vLLM's way to ask for a loaded LoRA adapter: its name as the model.
      model: request.lora ? request.lora : await this.modelName(signal),
      prompt: request.inputIds,
      max_tokens: request.maxNewTokens,
      temperature: request.sampling.temperature,
      top_p: request.sampling.topP,
      top_k: request.sampling.topK,
      stop: request.stop,
      include_stop_str_in_output: true,
      // 0: the sampled tokens' log-probs only (all this reads), which serve-engine's
      // /v1/completions also gives; vLLM would add the top token's at 1.
      logprobs: 0,
      return_token_ids: true,
    };
    if (request.seed !== null) body.seed = request.seed;
    const answer = (await callEngine(url, body, signal)) as {
      choices?: {
        token_ids?: number[] | null;
        finish_reason?: string | null;
        stop_reason?: string | number | null;
        logprobs?: { token_logprobs?: (number | null)[] } | null;
      }[];
    };
    const choice = answer?.choices?.[0];
    if (!choice || !Array.isArray(choice.token_ids)) {
      throw new ServiceError(
        `engine ${url} answered without choices[0].token_ids (vLLM 0.10.2 or later is needed ` +
          "for return_token_ids)",
      );
    }
    const outputIds = choice.token_ids;
    const lps = choice.logprobs?.token_logprobs;
    const logprobs =
      Array.isArray(lps) &&
      lps.length === outputIds.length &&
      lps.every((x) => typeof x === "number")
        ? (lps as number[])
        : null;
    const finish =
      choice.finish_reason === "length"
        ? "length"
        : choice.finish_reason === "abort"
          ? "abort"
          : "stop";
    return {
      outputIds,
      logprobs,
      finish,
      matched: choice.stop_reason ?? null,
      weightVersion: null,
    };
  }

  /** The served model's id, from `GET /v1/models` (asked once). */
  private modelName(signal?: AbortSignal): Promise<string> {
    this.model ??= callEngine(`${this.url}/v1/models`, undefined, signal).then((answer) => {
      const id = (answer as { data?: { id?: unknown }[] })?.data?.[0]?.id;
      if (typeof id !== "string") {
        throw new ServiceError(`engine ${this.url}/v1/models lists no model: is it a vLLM server?`);
      }
      return id;
    });
    return this.model;
  }
}
