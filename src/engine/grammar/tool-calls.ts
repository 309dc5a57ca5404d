/**
 * The grammar of a forced tool call (OpenAI's `tool_choice` "required" or a named function)
 * in the Hermes format Qwen2.5's chat template asks for and src/text/hermes-tool-calls.ts
 * reads back: `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>`, ARGS
 * following the function's `parameters` schema, several calls separated by a newline. This
 * is the structure SGLang constrains Qwen2.5 to for the same settings (sglang
 * python/sglang/srt/function_call/qwen25_detector.py, `structure_info` and `build_ebnf`), so
 * the model writes its own format rather than a bare JSON list as vLLM's does.
 */
import { type Grammar, GrammarBuilder, MANY } from "./builder.js";
import { SchemaCompiler } from "./json-schema.js";

export interface FunctionTool {
  name: string;
  /** The function's JSON Schema (absent: any object). */
  parameters?: unknown;
}

/**
 * Calls of `tools`: exactly one when `parallel` is false, else one or more. `fieldOf(i)`
 * names tool i in errors (`tools[2]`).
 */
export function toolCallGrammar(
  tools: FunctionTool[],
  parallel: boolean,
  fieldOf: (i: number) => string,
): Grammar {
  const g = new GrammarBuilder();
  const calls = tools.map((tool, i) => {
    const at = `${fieldOf(i)}.function.parameters`;
    const args =
      tool.parameters === undefined
        ? g.anyObject()
        : new SchemaCompiler(g, tool.parameters, at).compile(tool.parameters, at);
    const head = g.lit(`<tool_call>\n{"name": ${JSON.stringify(tool.name)}, "arguments": `);
    return g.seq(head, args, g.lit("}\n</tool_call>"));
  });
  const call = g.alt(...calls);
  return g.build(parallel ? g.seq(call, g.rep(g.seq(g.lit("\n"), call), 0, MANY)) : call);
}
