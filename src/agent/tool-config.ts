/**
 * The tools of the Hermes format: their schemas, as the chat template shows them to the
 * model, from a verl tool_config YAML (verl examples/sglang_multiturn/config/tool_config/
 * search_tool_config.yaml) or the built-in `search` tool.
 *
 * verl (verl/tools/utils/tool_registry.py, initialize_tools_from_config) validates each
 * `tool_schema` into its pydantic OpenAIFunctionToolSchema (verl/tools/schemas.py) and hands
 * the template `model_dump(exclude_unset=True, exclude_none=True)`: the models' fields in their
 * declared order, keys the models do not declare dropped (the example's `item:` under
 * query_list never reaches the model), null and absent ones left out. This does the same, so
 * the system prompt is byte for byte verl's.
 */
import { readFileSync } from "node:fs";
import { parse as parseYaml } from "yaml";
import { InputError } from "../runtime/errors.js";
import type { ToolSchema } from "../text/chat-template.js";

/** The only tool class this agent runs: verl's search tool (verl/tools/search_tool.py). */
export const SEARCH_TOOL_CLASS = "verl.tools.search_tool.SearchTool";

/** The built-in tool: the schema verl's search_tool_config.yaml gives, as verl dumps it. */
export const SEARCH_TOOL: ToolSchema = {
  type: "function",
  function: {
    name: "search",
    description: "Searches the web for relevant information based on the given query.",
    parameters: {
      type: "object",
      properties: {
        query_list: {
          type: "array",
          description:
            "A list of fully-formed semantic queries. The tool will return search results for each query.",
        },
      },
      required: ["query_list"],
    },
  },
};

/** The field order of verl's pydantic models, and how each field is checked. */
type Field = { name: string; kind: "str" | "bool" | "str[]" | "parameters" | "properties" };
const MODELS: Record<string, Field[]> = {
  tool: [
    { name: "type", kind: "str" },
    { name: "function", kind: "parameters" },
  ],
  function: [
    { name: "name", kind: "str" },
    { name: "description", kind: "str" },
    { name: "parameters", kind: "parameters" },
    { name: "strict", kind: "bool" },
  ],
  parameters: [
    { name: "type", kind: "str" },
    { name: "properties", kind: "properties" },
    { name: "required", kind: "str[]" },
  ],
  property: [
    { name: "type", kind: "str" },
    { name: "description", kind: "str" },
    { name: "enum", kind: "str[]" },
  ],
};
/** Fields without a default in verl's models (pydantic refuses their absence). */
const REQUIRED: Record<string, string[]> = {
  tool: ["type", "function"],
  function: ["name", "description"],
  parameters: ["type", "properties", "required"],
  property: ["type"],
};
/** Fields that may be null (`X | None = None`); null is then left out of the dump. */
const NULLABLE = new Set(["property.description", "property.enum"]);

/** The search tools of a verl tool_config file, in the file's order. */
export function loadToolConfig(path: string): ToolSchema[] {
  let doc: unknown;
  try {
    doc = parseYaml(readFileSync(path, "utf8"));
  } catch (err) {
    throw new InputError(
      `${path}: not a readable YAML tool config (rollout.multi_turn.tool_config_path): ${(err as Error).message}`,
    );
  }
  const tools = (doc as { tools?: unknown })?.tools;
  if (!Array.isArray(tools) || tools.length === 0) {
    throw new InputError(`${path}: expected a non-empty "tools" list (verl's tool_config format)`);
  }
  return tools.map((tool, i) => {
    const where = `${path}: tools[${i}]`;
    if (!isRecord(tool)) throw new InputError(`${where} is not a mapping`);
    if (tool.class_name !== SEARCH_TOOL_CLASS) {
      throw new InputError(
        `${where}.class_name is ${JSON.stringify(tool.class_name)}; the agent runs only ${SEARCH_TOOL_CLASS} (against retriever.url)`,
      );
    }
    const type = isRecord(tool.config) ? tool.config.type : undefined;
    if (type !== "native") {
      throw new InputError(
        `${where}.config.type is ${JSON.stringify(type)}; only "native" tools run here (no MCP)`,
      );
    }
    if (!isRecord(tool.tool_schema)) {
      throw new InputError(
        `${where}.tool_schema: a mapping is required (the schema the model sees)`,
      );
    }
    return dump(tool.tool_schema, "tool", `${where}.tool_schema`) as unknown as ToolSchema;
  });
}

/** pydantic's validate-then-model_dump(exclude_unset=True, exclude_none=True) of `model`. */
function dump(
  value: Record<string, unknown>,
  model: string,
  where: string,
): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const name of REQUIRED[model] ?? []) {
    if (!Object.hasOwn(value, name))
      throw new InputError(`${where}.${name}: required by verl's schema`);
  }
  for (const field of MODELS[model] ?? []) {
    if (!Object.hasOwn(value, field.name)) continue;
    const v = value[field.name];
    const at = `${where}.${field.name}`;
    if (v === null) {
      if (!NULLABLE.has(`${model}.${field.name}`)) throw new InputError(`${at}: must not be null`);
      continue;
    }
    out[field.name] = check(v, field, model, at);
  }
  return out;
}

function check(v: unknown, field: Field, model: string, at: string): unknown {
  switch (field.kind) {
    case "str":
      if (typeof v !== "string") throw new InputError(`${at}: must be a string`);
      return v;
    case "bool":
      if (typeof v !== "boolean") throw new InputError(`${at}: must be true or false`);
      return v;
    case "str[]":
      if (!Array.isArray(v) || !v.every((s) => typeof s === "string")) {
        throw new InputError(`${at}: must be a list of strings`);
      }
      return v;
    case "parameters": {
      if (!isRecord(v)) throw new InputError(`${at}: must be a mapping`);
      return dump(v, model === "tool" ? "function" : "parameters", at);
    }
    case "properties": {
      if (!isRecord(v)) throw new InputError(`${at}: must be a mapping`);
      return Object.fromEntries(
        Object.entries(v).map(([name, p]) => {
          if (!isRecord(p)) throw new InputError(`${at}.${name}: must be a mapping`);
          return [name, dump(p, "property", `${at}.${name}`)];
        }),
      );
    }
  }
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}
