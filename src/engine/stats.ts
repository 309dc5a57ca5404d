/**
 * The engine's figures for `/get_server_info` (JSON) and `/metrics` (Prometheus text
 * exposition format 0.0.4), from the engine's `stats` reply and the server's own counts.
 */
import type { EngineStats } from "./protocol.js";

export interface ServerFigures {
  engine: EngineStats;
  /** Output tokens per second over the last 10 s. */
  tokensPerSecond: number;
  /** HTTP requests being answered now. */
  httpInFlight: number;
  /** /generate requests answered since start, by status class. */
  generateRequests: Record<string, number>;
}

/** The `/get_server_info` state fields. */
export function stateFields(f: ServerFigures): Record<string, number | string | boolean> {
  const e = f.engine;
  return {
    running_requests: e.running,
    queued_requests: e.queued,
    kv_blocks_total: e.kv_blocks_total,
    kv_blocks_used: e.kv_blocks_used,
    kv_blocks_free: e.kv_blocks_total - e.kv_blocks_used,
    kv_blocks_cached: e.kv_blocks_cached,
    prefix_cache_hit_rate: hitRate(e),
    prefix_hit_tokens: e.prefix_hit_tokens,
    prompt_tokens: e.prompt_tokens,
    generated_tokens: e.generated_tokens,
    decode_steps: e.decode_steps,
    kv_full_steps: e.kv_full_steps,
    preemptions: e.preemptions,
    kv_released: e.kv_released === true,
    tokens_per_second: round(f.tokensPerSecond),
    weight_version: e.weight_version,
  };
}

function hitRate(e: EngineStats): number {
  return e.prompt_tokens > 0 ? round(e.prefix_hit_tokens / e.prompt_tokens) : 0;
}

function round(x: number): number {
  return Math.round(x * 1e4) / 1e4;
}

/** Prometheus text format: HELP, TYPE and value lines per metric. */
export function prometheusText(f: ServerFigures): string {
  const e = f.engine;
  const lines: string[] = [];
  const metric = (
    name: string,
    type: "gauge" | "counter",
    help: string,
    values: [string, number][],
  ) => {
    lines.push(`# HELP searchr1_engine_${name} ${help}`, `# TYPE searchr1_engine_${name} ${type}`);
    for (const [labels, value] of values) lines.push(`searchr1_engine_${name}${labels} ${value}`);
  };
  metric("running_requests", "gauge", "Sequences being decoded.", [["", e.running]]);
  metric("queued_requests", "gauge", "Sequences waiting for KV cache room or a batch slot.", [
    ["", e.queued],
  ]);
  metric("kv_blocks_total", "gauge", "KV cache blocks.", [["", e.kv_blocks_total]]);
  metric("kv_blocks_used", "gauge", "KV cache blocks held by live sequences.", [
    ["", e.kv_blocks_used],
  ]);
  metric("kv_blocks_cached", "gauge", "Free KV cache blocks that hold a reusable prefix.", [
    ["", e.kv_blocks_cached],
  ]);
  metric(
    "prefix_cache_hit_rate",
    "gauge",
    "Prompt tokens whose KV came from the prefix cache, as a fraction of all prompt tokens.",
    [["", hitRate(e)]],
  );
  metric("prompt_tokens_total", "counter", "Prompt tokens received.", [["", e.prompt_tokens]]);
  metric("prefix_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.", [
    ["", e.prefix_hit_tokens],
  ]);
  metric("generated_tokens_total", "counter", "Output tokens sampled.", [["", e.generated_tokens]]);
  metric("decode_steps_total", "counter", "Decode steps run.", [["", e.decode_steps]]);
  metric(
    "kv_full_steps_total",
    "counter",
    "Steps in which the KV cache was full (a sequence waited for room or was preempted).",
    [["", e.kv_full_steps]],
  );
  metric("preemptions_total", "counter", "Running sequences preempted to free KV cache room.", [
    ["", e.preemptions],
  ]);
  metric("tokens_per_second", "gauge", "Output tokens per second over the last 10 s.", [
    ["", round(f.tokensPerSecond)],
  ]);
  metric("weight_version", "gauge", "1, labelled with the weight version in use.", [
    [`{version="${e.weight_version.replace(/["\\\n]/g, "_")}"}`, 1],
  ]);
  metric("http_requests_in_flight", "gauge", "HTTP requests being answered.", [
    ["", f.httpInFlight],
  ]);
  metric(
    "generate_requests_total",
    "counter",
    "POST /generate requests answered, by status code class.",
    Object.entries(f.generateRequests).map(([code, n]) => [`{code="${code}"}`, n]),
  );
  return `${lines.join("\n")}\n`;
}
