/**
 * A constraint as a request names it, compiled into the engine's grammar: the one place
 * SGLang's sampling keys (`json_schema`, `regex`, `ebnf`), OpenAI's `response_format` and
 * vLLM's structured outputs (`json`, `regex`, `grammar`, `choice`, `json_object`) meet.
 */
import { HttpError, typeOf } from "../../runtime/http-server.js";
import { type Grammar, GrammarBuilder } from "./builder.js";
import { ebnfGrammar } from "./ebnf.js";
import { jsonBuilder, jsonSchemaGrammar, type Whitespace } from "./json-schema.js";
import { regexGrammar } from "./regex.js";

/**
 * `json` (a JSON Schema, or its JSON text), `json_object` (true: any JSON object), `regex`,
 * `grammar` (EBNF) or `choice` (one of a list of strings).
 */
export type ConstraintKind = "json" | "json_object" | "regex" | "grammar" | "choice";

/** The grammar of `value`, a constraint of `kind` given as `field` (named in errors). */
export function requestedGrammar(
  kind: ConstraintKind,
  value: unknown,
  field: string,
  ws?: Whitespace,
): Grammar {
  const bad = (want: string) =>
    new HttpError(400, `"${field}" must be ${want}, got ${typeOf(value)}`);
  switch (kind) {
    case "regex":
    case "grammar": {
      if (typeof value !== "string") {
        throw bad(kind === "regex" ? "a regular expression" : "an EBNF grammar");
      }
      return kind === "regex" ? regexGrammar(value, field) : ebnfGrammar(value, field);
    }
    case "choice": {
      if (
        !Array.isArray(value) ||
        value.length === 0 ||
        !value.every((v) => typeof v === "string")
      ) {
        throw bad("a non-empty list of strings");
      }
      const g = new GrammarBuilder();
      return g.build(g.alt(...(value as string[]).map((v) => g.lit(v))));
    }
    case "json_object": {
      if (value !== true) throw bad("true");
      const g = jsonBuilder(ws);
      return g.build(g.anyObject());
    }
    case "json":
      return jsonSchemaGrammar(value, field, ws);
  }
}
