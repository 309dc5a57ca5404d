/**
 * Hermes-style tool calls (Qwen2.5's chat template asks for them): each call is a JSON
 * object `{"name": ..., "arguments": ...}` between `<tool_call>` and `</tool_call>`.
 *
 * Parsed as verl's HermesToolParser.extract_tool_calls does (verl
 * `verl/experimental/agent_loop/tool_parser.py`, itself adapted from vLLM's
 * `vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py`):
 * - without both `<tool_call>` and `</tool_call>` in the text: no calls, content = the text;
 * - every non-greedy match of `<tool_call>(.*?)</tool_call>` (across lines) is decoded
 *   with `json.loads`; a match that is not JSON, not an object, has no `name` or no
 *   `arguments` key, or whose name is not a string (pydantic's `name: str`) is dropped;
 *   `arguments` may be any JSON value (verl keeps it, and its tool then reports the error);
 * - content = the text with every `<tool_call>...</tool_call>` block removed (nothing else
 *   is trimmed).
 *
 * One difference from Python's json.loads: JSON.parse refuses the non-standard literals
 * NaN, Infinity and -Infinity that Python accepts, so a call spelling them is dropped here.
 */

export interface HermesToolCall {
  name: string;
  /** The decoded `arguments` value: an object when the model follows the schema. */
  arguments: unknown;
}

export interface HermesToolCalls {
  /** The text without its tool-call blocks. */
  content: string;
  /** The decodable calls, in the order written (at most `maxCalls`). */
  calls: HermesToolCall[];
}

const START = "<tool_call>";
const END = "</tool_call>";
const CALL = /<tool_call>([\s\S]*?)<\/tool_call>/g;

/**
 * The tool calls in `text` (a decoded completion, special tokens kept as verl decodes it)
 * and the text around them. `maxCalls` keeps the first ones, as verl's agent loop slices
 * the parsed calls with `max_parallel_calls`.
 */
export function parseHermesToolCalls(
  text: string,
  maxCalls = Number.POSITIVE_INFINITY,
): HermesToolCalls {
  if (!(maxCalls >= 0)) throw new RangeError(`maxCalls must be >= 0 (got ${maxCalls})`);
  if (!text.includes(START) || !text.includes(END)) return { content: text, calls: [] };
  const calls: HermesToolCall[] = [];
  for (const match of text.matchAll(CALL)) {
    const call = decodeCall(match[1] as string);
    if (call) calls.push(call);
  }
  return { content: text.replace(CALL, ""), calls: calls.slice(0, maxCalls) };
}

/** One call's JSON, or null where verl's `json.loads` / key lookups / pydantic would fail. */
function decodeCall(json: string): HermesToolCall | null {
  let value: unknown;
  try {
    value = JSON.parse(json);
  } catch {
    return null;
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) return null;
  const record = value as Record<string, unknown>;
  if (!Object.hasOwn(record, "name") || !Object.hasOwn(record, "arguments")) return null;
  if (typeof record.name !== "string") return null;
  return { name: record.name, arguments: record.arguments };
}
