/**
 * What the agent asks of an inference engine, whichever one serves it: the native engine
 * or SGLang (`POST /generate`), or vLLM (`POST /v1/completions`). Token ids in, token ids
 * and their log-probs out: the agent never re-encodes generated text.
 */

export interface Sampling {
  /** 0 = greedy. */
  temperature: number;
  topP: number;
  /** -1 = off. */
  topK: number;
}

export interface TurnRequest {
  inputIds: readonly number[];
  maxNewTokens: number;
  sampling: Sampling;
  /** Generation ends at the first token whose decoded text completes one of these. */
  stop: readonly string[];
  /** Seeds the sampler (the same request then gives the same tokens); null = unseeded. */
  seed: number | null;
  /** A LoRA adapter the engine has loaded (`loadLoraAdapter`'s name); absent or null: the base. */
  lora?: string | null;
}

export interface TurnOutput {
  /** Every generated token, the one that completed a stop string included. */
  outputIds: number[];
  /** log p of each output token (the engine's), or null when the engine gave none. */
  logprobs: number[] | null;
  /** `stop` (a stop string or the EOS token), `length`, or `abort`. */
  finish: "stop" | "length" | "abort";
  /** The stop string or token id that ended generation, when `finish` is `stop`. */
  matched: string | number | null;
  /** The engine's weight version, where it reports one. */
  weightVersion: string | null;
}

export interface EngineClient {
  /** The engine's base URL (no path). */
  readonly url: string;
  generate(request: TurnRequest, signal?: AbortSignal): Promise<TurnOutput>;
  /**
   * Loads new weights from a Hugging Face folder without restarting (SGLang's
   * `/update_weights_from_disk`); absent where the engine has no such call.
   */
  updateWeightsFromDisk?(modelPath: string): Promise<void>;
  /**
   * SGLang's `/load_lora_adapter` and `/unload_lora_adapter`: a PEFT adapter folder loaded
   * under a name, which requests then name (`TurnRequest.lora`), served beside the base
   * weights. Absent where the engine has no such call.
   */
  loadLoraAdapter?(name: string, path: string): Promise<void>;
  unloadLoraAdapter?(name: string): Promise<void>;
  /**
   * SGLang's `/release_memory_occupation` of the KV cache: its memory goes back to the device
   * (a trainer on the same GPU uses it) and generation waits for `resumeMemoryOccupation`.
   * Absent where the engine has no such call.
   */
  releaseMemoryOccupation?(): Promise<void>;
  resumeMemoryOccupation?(): Promise<void>;
  /**
   * For an engine of several replicas (EngineRouter): a route for one trajectory, which sends
   * every turn to the replica that served its first; absent for a single engine.
   */
  route?(): EngineRoute;
}

/** The engine of one trajectory's turns; `release()` once the trajectory is over. */
export interface EngineRoute {
  generate(request: TurnRequest, signal?: AbortSignal): Promise<TurnOutput>;
  release(): void;
}
