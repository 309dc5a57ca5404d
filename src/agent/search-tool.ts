/**
 * A Hermes tool call answered as verl answers it (verl verl/experimental/agent_loop/
 * tool_agent_loop.py `_call_tool`, verl/tools/search_tool.py `SearchTool.execute`,
 * verl/tools/utils/search_r1_like_utils.py `perform_single_search_batch` and
 * `_passages2string`): the text of the `tool` message, byte for byte.
 */
import type { HermesToolCall } from "../text/hermes-tool-calls.js";
import { pythonStrip } from "../text/python-string.js";
import type { Passage } from "./observation.js";

/** What one call gives back. */
export interface ToolResult {
  text: string;
  /** The queries sent to the retriever, and the documents of each. */
  queries: string[];
  documents: Passage[][];
  /** The text was cut to the length limit. */
  truncated: boolean;
}

/** One search: all of a call's queries, answered together (one retriever request). */
export type SearchMany = (queries: string[]) => Promise<Passage[][]>;

/**
 * Answers `call` with the search tools named `tools`; the text is then cut to
 * `maxLength` characters (truncateToolResponse), except for the loop's own errors, which
 * verl returns before cutting.
 */
export async function runToolCall(
  call: HermesToolCall,
  tools: ReadonlySet<string>,
  search: SearchMany,
  maxLength: number,
  side: TruncateSide,
): Promise<ToolResult> {
  const none = { queries: [], documents: [], truncated: false };
  // verl: `self.tools[tool_name]` raises KeyError, reported as str(KeyError(name)).
  if (!tools.has(call.name)) {
    return { text: `Error when executing tool: ${pythonStrRepr(call.name)}`, ...none };
  }
  const args = call.arguments;
  // verl: `parameters.get("query_list")` on a non-dict raises AttributeError.
  if (args === null || typeof args !== "object" || Array.isArray(args)) {
    return {
      text: `Error when executing tool: '${pythonTypeName(args)}' object has no attribute 'get'`,
      ...none,
    };
  }
  const queryList = (args as Record<string, unknown>).query_list;
  let text: string;
  let queries: string[] = [];
  let documents: Passage[][] = [];
  if (!pythonTruthy(queryList) || !Array.isArray(queryList)) {
    text = JSON.stringify({
      result: "Error: 'query_list' is missing, empty, or not a list in parameters.",
    });
  } else if (!queryList.every((q) => typeof q === "string")) {
    // verl would post the items as they are and report the retriever's refusal; the
    // retriever protocol takes strings only, so the call is answered without a request.
    text = jsonResult("Search error: every item of query_list must be a string");
  } else {
    queries = queryList as string[];
    documents = await search(queries);
    text = jsonResult(documents.map(passagesToText).join("\n---\n"));
  }
  const cut = truncateToolResponse(text, maxLength, side);
  return { text: cut, queries, documents, truncated: cut !== text };
}

/** `json.dumps({"result": text}, ensure_ascii=False)`: Python's separators, JSON's escapes. */
function jsonResult(text: string): string {
  return `{"result": ${JSON.stringify(text)}}`;
}

/** `_passages2string`: `Doc i (Title: <first line>)\n<rest>\n\n` per document, stripped. */
export function passagesToText(passages: readonly Passage[]): string {
  let out = "";
  passages.forEach((passage, i) => {
    const [title, ...rest] = passage.contents.split("\n");
    out += `Doc ${i + 1} (Title: ${title})\n${rest.join("\n")}\n\n`;
  });
  return pythonStrip(out);
}

export type TruncateSide = "left" | "middle" | "right";

/**
 * verl's cut of a tool response longer than `max` characters (Python's len: code points):
 * left keeps the start + "...(truncated)", right "(truncated)..." + the end, middle both
 * halves around "...(truncated)...". Python's `text[-0:]` is the whole text, kept as is.
 */
export function truncateToolResponse(text: string, max: number, side: TruncateSide): string {
  const chars = Array.from(text);
  if (chars.length <= max) return text;
  const head = (n: number) => chars.slice(0, n).join("");
  const tail = (n: number) => (n === 0 ? text : chars.slice(-n).join(""));
  if (side === "left") return `${head(max)}...(truncated)`;
  if (side === "right") return `(truncated)...${tail(max)}`;
  const half = Math.floor(max / 2);
  return `${head(half)}...(truncated)...${tail(half)}`;
}

/** Python's truthiness of a JSON value. */
function pythonTruthy(v: unknown): boolean {
  if (v === undefined || v === null || v === false || v === 0 || v === "") return false;
  if (Array.isArray(v)) return v.length > 0;
  if (typeof v === "object") return Object.keys(v as object).length > 0;
  return true;
}

/** The Python type name of a decoded JSON value (a JSON number with no fraction: int). */
function pythonTypeName(v: unknown): string {
  if (v === null) return "NoneType";
  if (Array.isArray(v)) return "list";
  if (typeof v === "string") return "str";
  if (typeof v === "boolean") return "bool";
  if (typeof v === "number") return Number.isInteger(v) ? "int" : "float";
  return "dict";
}

/** Python's repr() of a str: single quotes unless it holds ' and no ". */
export function pythonStrRepr(s: string): string {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of s) {
    const code = ch.codePointAt(0) as number;
    if (ch === "\\") out += "\\\\";
    else if (ch === quote) out += `\\${quote}`;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (code < 0x20 || code === 0x7f) out += `\\x${code.toString(16).padStart(2, "0")}`;
    else out += ch;
  }
  return out + quote;
}
