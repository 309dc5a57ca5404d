/**
 * One generated sequence, from its `generate` command to the SGLang answer object: tokens
 * and log-probs as the engine samples them, stop strings checked after each token (the
 * sequence ends at the first token whose text contains one: the engine is told to abort it
 * and its later tokens are dropped), and the text decoded and trimmed as SGLang does.
 *
 * A streamed sequence (the OpenAI routes' `stream: true`) also reports its text as it
 * grows: only text that is final, i.e. never a possible start of a stop string (the last
 * `longest stop - 1` characters are held back, as vLLM's detokenizer holds them) and never
 * the text of a token that may end the sequence (EOS, stop_token_ids: it is trimmed).
 */
import type { Detokenizer } from "./detokenizer.js";
import { StopChecker, type StopHit } from "./detokenizer.js";
import type { SamplingParams, SequenceSpec } from "./generate-request.js";
import type { NativeEngine, SequenceHandler } from "./native-engine.js";
import type { DoneEvent, FinishReason, GenerateCommand, TopLogprob } from "./protocol.js";

export interface GenerateOutput {
  text: string;
  output_ids: number[];
  meta_info: {
    id: string;
    /**
     * `matched`: the stop string, or the EOS / stop_token_ids token, that ended the
     * sequence; null for `length` and `abort`.
     */
    finish_reason: {
      type: FinishReason;
      matched: string | number | null;
      length?: number;
      message?: string;
    };
    prompt_tokens: number;
    completion_tokens: number;
    cached_tokens: number;
    /** `[logprob, token_id, null]` per output token; only with return_logprob. */
    output_token_logprobs?: [number, number, null][];
    /**
     * Per output token, its `top_logprobs_num` most likely tokens as `[logprob, token_id,
     * null]`, most likely first (SGLang's tokenizer_manager detokenize_top_logprobs_tokens
     * without return_text_in_logprobs); only with return_logprob and top_logprobs_num > 0.
     */
    output_top_logprobs?: [number, number, null][][];
    weight_version: string;
    /** Seconds from the request reaching the engine to its last token. */
    e2e_latency: number;
  };
}

/**
 * Called, in order, with the final text so far and how many tokens it came from (the
 * first `tokens` of `outputIds`); the last call is followed by the sequence's result,
 * whose text extends it.
 */
export type TextListener = (text: string, tokens: number) => void;

export class Sequence implements SequenceHandler {
  private readonly ids: number[] = [];
  private readonly logprobs: number[] = [];
  /** Per token, its most likely tokens (empty lists when none were asked for). */
  private readonly tops: TopLogprob[][] = [];
  private readonly checker: StopChecker | null;
  /** Work on this sequence's events, in order (stop checks wait for the tokenizer). */
  private chain: Promise<void> = Promise.resolve();
  private stopped: { match: StopHit; tokens: number } | null = null;
  private settled = false;
  private failure: Error | null = null;
  private started = 0;
  private resolve!: (output: GenerateOutput) => void;
  private reject!: (err: Error) => void;
  /** The answer object, or the engine's refusal / death. */
  readonly result: Promise<GenerateOutput>;

  constructor(
    readonly rid: string,
    readonly spec: SequenceSpec,
    private readonly engine: NativeEngine,
    private readonly detokenizer: Detokenizer | null,
    private readonly onText: TextListener | null = null,
  ) {
    this.result = new Promise((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
    });
    const { stop, skipSpecialTokens, ignoreEos, stopTokenIds } = spec.params;
    this.checker =
      detokenizer && (stop.length > 0 || onText)
        ? new StopChecker(detokenizer, stop, skipSpecialTokens)
        : null;
    this.holdBack = Math.max(0, ...stop.map((s) => s.length - 1));
    this.endIds = new Set(
      onText ? [...(ignoreEos ? [] : engine.info.eos_token_ids), ...stopTokenIds] : [],
    );
    if (spec.params.grammar) {
      // Checked where the request is read (a grammar needs the tokenizer); the bytes go
      // ahead of this sequence's generate command.
      const tokens = detokenizer as Detokenizer;
      engine.sendTokenBytes(() => tokens.tokenBytes());
    }
  }

  /** Characters of the text a stream holds back (a stop string may start there). */
  private readonly holdBack: number;
  /** Tokens that may end the sequence: a stream leaves their text to the result. */
  private readonly endIds: Set<number>;

  /** Sends the sequence to the engine (max_new_tokens 0 is answered here). */
  start(): void {
    this.started = performance.now();
    const { params, inputIds } = this.spec;
    if (params.maxNewTokens === 0) {
      this.settle(
        this.output(
          [],
          { type: "length", matched: null, length: 0 },
          {
            prompt_tokens: inputIds.length,
            cached_tokens: 0,
            weight_version: this.engine.weightVersion,
          },
        ),
      );
      return;
    }
    this.engine.generate(
      {
        op: "generate",
        rid: this.rid,
        input_ids: inputIds,
        max_new_tokens: params.maxNewTokens,
        temperature: params.temperature,
        top_p: params.topP,
        top_k: params.topK,
        min_p: params.minP,
        seed: params.seed,
        stop_token_ids: params.stopTokenIds,
        ignore_eos: params.ignoreEos,
        ...(this.spec.topLogprobs > 0 ? { top_logprobs: this.spec.topLogprobs } : {}),
        ...(this.spec.lora ? { lora: this.spec.lora } : {}),
        ...(params.grammar ? { grammar: params.grammar } : {}),
        ...penaltiesOf(params),
      },
      this,
    );
  }

  /** The client is gone: the engine stops working on it. */
  cancel(): void {
    if (!this.settled) this.engine.abort(this.rid);
  }

  token(id: number, logprob: number, top: TopLogprob[]): void {
    if (this.stopped) return;
    this.ids.push(id);
    this.logprobs.push(logprob);
    this.tops.push(top);
    const checker = this.checker;
    if (!checker) return;
    const tokens = this.ids.length;
    this.chain = this.chain
      .then(async () => {
        if (this.stopped || this.settled) return;
        const id = this.ids[tokens - 1] as number;
        const match = await checker.push(id);
        if (match && !this.stopped) {
          this.stopped = { match, tokens };
          this.engine.abort(this.rid);
        }
        if (this.onText && !this.stopped && !this.endIds.has(id)) {
          const text = checker.decoded;
          this.onText(text.slice(0, Math.max(0, text.length - this.holdBack)), tokens);
        }
      })
      .catch((err: unknown) => this.fail(err as Error));
  }

  done(event: DoneEvent): void {
    this.chain = this.chain
      .then(async () => this.settle(await this.finish(event)))
      .catch((err: unknown) => this.fail(err as Error));
  }

  error(err: Error): void {
    this.chain = this.chain.then(() => this.fail(err));
  }

  private fail(err: Error): void {
    if (this.settled) return;
    this.settled = true;
    this.failure = err;
    this.reject(err);
  }

  /** The tokens sampled so far (a stream reads them as its text grows). */
  get outputIds(): readonly number[] {
    return this.ids;
  }

  /** Their log-probs. */
  get outputLogprobs(): readonly number[] {
    return this.logprobs;
  }

  /** Their most likely tokens, `[token_id, logprob]`, most likely first (spec.topLogprobs). */
  get outputTopLogprobs(): readonly TopLogprob[][] {
    return this.tops;
  }

  /** Why the sequence failed (the engine refused it, or died), if it did. */
  get refusal(): Error | null {
    return this.failure;
  }

  private settle(output: GenerateOutput): void {
    if (this.settled) return;
    this.settled = true;
    this.resolve(output);
  }

  private async finish(event: DoneEvent): Promise<GenerateOutput> {
    const params = this.spec.params;
    const stopped = this.stopped;
    let ids = this.ids;
    let reason: GenerateOutput["meta_info"]["finish_reason"];
    if (stopped) {
      ids = ids.slice(0, stopped.tokens);
      // The stop string's token is also an EOS / stop token: the token decides, as in SGLang.
      const byToken =
        event.reason === "stop" &&
        event.completion_tokens === stopped.tokens &&
        event.matched === ids[ids.length - 1];
      reason = byToken
        ? { type: "stop", matched: event.matched }
        : { type: "stop", matched: stopped.match.stop };
    } else if (event.reason === "stop") {
      reason = { type: "stop", matched: event.matched };
    } else if (event.reason === "length") {
      reason = { type: "length", matched: null, length: ids.length };
    } else {
      reason = { type: "abort", matched: null, message: "aborted by the engine" };
    }
    const output = this.output(ids, reason, event);
    output.text = await this.text(ids, reason.matched, params.noStopTrim);
    return output;
  }

  /** The decoded text, trimmed as SGLang does unless no_stop_trim. */
  private async text(
    ids: number[],
    matched: string | number | null,
    noStopTrim: boolean,
  ): Promise<string> {
    const detokenizer = this.detokenizer;
    if (!detokenizer) return "";
    const skip = this.spec.params.skipSpecialTokens;
    if (typeof matched === "number" && !noStopTrim) {
      return detokenizer.decode(ids.slice(0, -1), skip);
    }
    const text = await detokenizer.decode(ids, skip);
    if (typeof matched === "string" && !noStopTrim) {
      const at = text.indexOf(matched);
      if (at >= 0) return text.slice(0, at);
      // Decoding the whole output and token by token disagree (a tokenizer whose decoder
      // joins tokens differently): cut where the token-by-token text found it.
      return this.stopped?.match.before ?? text;
    }
    return text;
  }

  private output(
    ids: number[],
    reason: GenerateOutput["meta_info"]["finish_reason"],
    event: Pick<DoneEvent, "prompt_tokens" | "cached_tokens" | "weight_version">,
  ): GenerateOutput {
    const meta: GenerateOutput["meta_info"] = {
      id: this.rid,
      finish_reason: reason,
      prompt_tokens: event.prompt_tokens,
      completion_tokens: ids.length,
      cached_tokens: event.cached_tokens,
      weight_version: event.weight_version,
      e2e_latency: (performance.now() - this.started) / 1000,
    };
    if (this.spec.returnLogprob) {
      meta.output_token_logprobs = ids.map((id, i) => [this.logprobs[i] as number, id, null]);
      if (this.spec.topLogprobs > 0) {
        meta.output_top_logprobs = ids.map((_, i) =>
          (this.tops[i] ?? []).map(([top, lp]): [number, number, null] => [lp, top, null]),
        );
      }
    }
    return { text: "", output_ids: ids, meta_info: meta };
  }
}

/** The generate command's penalty fields, those away from their neutral values only. */
function penaltiesOf(p: SamplingParams): Partial<GenerateCommand> {
  return {
    ...(p.repetitionPenalty !== 1 ? { repetition_penalty: p.repetitionPenalty } : {}),
    ...(p.frequencyPenalty !== 0 ? { frequency_penalty: p.frequencyPenalty } : {}),
    ...(p.presencePenalty !== 0 ? { presence_penalty: p.presencePenalty } : {}),
    ...(p.minNewTokens > 0 ? { min_new_tokens: p.minNewTokens } : {}),
    ...(p.logitBias.length > 0 ? { logit_bias: p.logitBias } : {}),
  };
}
