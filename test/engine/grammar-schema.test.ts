/**
 * JSON Schema and forced tool calls compiled into the engine's grammars
 * (src/engine/grammar/), checked with a second recognizer (test/helpers/grammar-match.ts):
 * the documents each schema accepts match, those it refuses do not, and what the compiler
 * cannot enforce is refused naming the keyword and where it is.
 */
import { describe, expect, it } from "vitest";
import { jsonSchemaGrammar } from "../../src/engine/grammar/json-schema.js";
import { toolCallGrammar } from "../../src/engine/grammar/tool-calls.js";
import { grammarMatches } from "../helpers/grammar-match.js";
import { badRequestOf } from "../helpers/usage-error.js";

function check(schema: unknown, valid: string[], invalid: string[]) {
  const g = jsonSchemaGrammar(schema, "schema");
  for (const doc of valid) expect(grammarMatches(g, doc), doc).toBe(true);
  for (const doc of invalid) expect(grammarMatches(g, doc), doc).toBe(false);
}

describe("JSON Schema → grammar", () => {
  it("any value: JSON's own grammar (RFC 8259), whitespace bounded", () => {
    check(
      {},
      [
        '{"a": [1, -2.5e3, true, null, {"b": "c"}], "d": {}}',
        "[]",
        '"\\u00e9\\n\\"x"',
        "0",
        "-0.25E+10",
        '{\n  "x": [\n    1\n  ]\n}',
        `"${"é€😀"}"`,
      ],
      [
        '{"a": 1,}',
        "[1 2]",
        "01",
        "1.",
        '"\\x"',
        '"a\nb"', // a raw newline inside a string
        "{'a': 1}",
        "tru",
        `[${" ".repeat(21)}]`, // more whitespace than one place allows
        '{"a" 1}',
      ],
    );
  });

  it("an object: its properties in the schema's order, required ones always, no others", () => {
    const schema = {
      type: "object",
      properties: {
        name: { type: "string", minLength: 1, maxLength: 3 },
        age: { type: "integer" },
        tags: { type: "array", items: { enum: ["a", "b"] }, maxItems: 2 },
      },
      required: ["name", "age"],
      additionalProperties: false,
    };
    check(
      schema,
      [
        '{"name": "ab", "age": 3}',
        '{"name":"é€x","age":-12,"tags":["b","a"]}',
        '{ "name" : "x" , "age" : 0 , "tags" : [ ] }',
      ],
      [
        '{"age": 3, "name": "ab"}', // another order
        '{"name": "ab"}', // a required property missing
        '{"name": "", "age": 3}', // minLength
        '{"name": "abcd", "age": 3}', // maxLength counts characters
        '{"name": "ab", "age": 3.5}', // not an integer
        '{"name": "ab", "age": 3, "tags": ["c"]}',
        '{"name": "ab", "age": 3, "tags": ["a", "b", "a"]}', // maxItems
        '{"name": "ab", "age": 3, "x": 1}', // an extra property
      ],
    );
  });

  it("optional properties may all be absent; minItems; nullable; const; type lists", () => {
    check(
      {
        type: "object",
        properties: {
          a: { type: ["integer", "null"] },
          b: { const: "x" },
          c: { type: "array", minItems: 2, items: { type: "boolean" } },
          d: { type: "number", nullable: true },
        },
      },
      ["{}", "{ }", '{"b": "x"}', '{"a": null, "d": 1.5}', '{"c": [true, false]}', '{"d": null}'],
      ['{"b": "y"}', '{"c": [true]}', '{"a": "1"}', '{"b": "x",}'],
    );
  });

  it("anyOf, oneOf, allOf of one, and $ref to $defs and to the root (recursion)", () => {
    check(
      {
        $defs: {
          node: {
            type: "object",
            properties: {
              v: { type: "integer" },
              kids: { type: "array", items: { $ref: "#/$defs/node" } },
            },
            required: ["v"],
          },
        },
        anyOf: [{ $ref: "#/$defs/node" }, { type: "string", maxLength: 2 }],
      },
      ['{"v": 1}', '{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}', '"ab"'],
      ['{"v": 1, "kids": [{"w": 2}]}', '"abc"', "1"],
    );
    check({ oneOf: [{ type: "boolean" }, { type: "null" }] }, ["true", "null"], ["1"]);
    check({ allOf: [{ type: "integer" }] }, ["7"], ["7.5"]);
    check(
      { type: "object", properties: { next: { $ref: "#" } } },
      ["{}", '{"next": {"next": {}}}'],
      ['{"next": 1}'],
    );
  });

  it("vLLM's whitespace_pattern replaces JSON's whitespace between tokens", () => {
    const schema = {
      type: "object",
      properties: { a: { type: "array", items: { type: "integer" } } },
    };
    const compact = jsonSchemaGrammar(schema, "s", { pattern: "", field: "w" });
    expect(grammarMatches(compact, '{"a":[1,2]}')).toBe(true);
    expect(grammarMatches(compact, '{"a": [1,2]}')).toBe(false);
    const oneSpace = jsonSchemaGrammar(schema, "s", { pattern: "[ ]?", field: "w" });
    expect(grammarMatches(oneSpace, '{ "a": [1, 2] }')).toBe(true);
    expect(grammarMatches(oneSpace, '{"a":  [1]}')).toBe(false);
    expect(grammarMatches(oneSpace, '{"a":\n[1]}')).toBe(false);
    expect(() =>
      jsonSchemaGrammar(schema, "s", { pattern: "(", field: "guided_whitespace_pattern" }),
    ).toThrow(/"guided_whitespace_pattern": an unclosed group/);
  });

  it("objects without properties: any keys, with additionalProperties' values", () => {
    check(
      { type: "object", additionalProperties: { type: "integer" } },
      ['{"x": 1, "y": 2}', "{}"],
      ['{"x": "1"}'],
    );
    check({ type: "object", additionalProperties: false }, ["{}", "{  }"], ['{"x": 1}']);
  });

  it("what it cannot enforce is a 400 naming the keyword and where it is", () => {
    const refused = (schema: unknown, message: RegExp) =>
      expect(
        badRequestOf(() => jsonSchemaGrammar(schema, "response_format.json_schema.schema")),
        String(schema),
      ).toMatch(message);
    refused(
      { type: "object", properties: { day: { type: "string", format: "date" } } },
      /"response_format\.json_schema\.schema\.properties\.day\.format": the JSON Schema keyword "format" is not supported/,
    );
    refused({ type: "integer", minimum: 1 }, /"minimum" is not supported/);
    refused({ type: "array", uniqueItems: true }, /"uniqueItems" is not supported/);
    refused({ type: "strings" }, /\.type" must be one of string, number/);
    refused({ $ref: "https://example.com/s.json" }, /only "#", "#\/\$defs\/NAME"/);
    refused(
      { $ref: "#/$defs/missing" },
      /"response_format\.json_schema\.schema\.\$defs\.missing" does not exist/,
    );
    refused(
      { type: "object", properties: { a: {} }, required: ["b"] },
      /names "b", which is not in "properties"/,
    );
    refused({ allOf: [{ type: "integer" }, { minimum: 0 }] }, /only a list of one schema/);
    refused(
      { anyOf: [{ type: "integer" }], type: "string" },
      /"anyOf" beside "type" is not supported/,
    );
    refused(false, /is false: no value is valid/);
    refused({ type: "array", minItems: 3, maxItems: 2 }, /schema\.maxItems" is below "minItems"/);
  });
});

describe("forced tool calls (Hermes, as Qwen2.5's template asks)", () => {
  const tools = [
    {
      name: "search",
      parameters: {
        type: "object",
        properties: { query_list: { type: "array", items: { type: "string" }, minItems: 1 } },
        required: ["query_list"],
      },
    },
    { name: "now" },
  ];
  const call = (name: string, args: string) =>
    `<tool_call>\n{"name": "${name}", "arguments": ${args}}\n</tool_call>`;

  it('"required": one or more calls of the tools, each with its arguments\' schema', () => {
    const g = toolCallGrammar(tools, true, (i) => `tools[${i}]`);
    expect(grammarMatches(g, call("search", '{"query_list": ["a", "b"]}'))).toBe(true);
    expect(grammarMatches(g, call("now", "{}"))).toBe(true);
    expect(
      grammarMatches(g, `${call("now", '{"tz": 1}')}\n${call("search", '{"query_list": ["x"]}')}`),
    ).toBe(true);
    expect(grammarMatches(g, call("search", '{"query_list": []}'))).toBe(false);
    expect(grammarMatches(g, call("other", "{}"))).toBe(false);
    expect(grammarMatches(g, `text first ${call("now", "{}")}`)).toBe(false);
    expect(grammarMatches(g, "")).toBe(false);
  });

  it("one call only without parallel calls; a named function: that one", () => {
    const one = toolCallGrammar(tools, false, (i) => `tools[${i}]`);
    expect(grammarMatches(one, `${call("now", "{}")}\n${call("now", "{}")}`)).toBe(false);
    const named = toolCallGrammar([tools[0] as (typeof tools)[0]], false, () => "tools[0]");
    expect(grammarMatches(named, call("search", '{"query_list": ["q"]}'))).toBe(true);
    expect(grammarMatches(named, call("now", "{}"))).toBe(false);
  });

  it("a tool's parameters that cannot be enforced are named", () => {
    expect(() =>
      toolCallGrammar(
        [{ name: "f", parameters: { type: "string", pattern: "a+" } }],
        false,
        () => "tools[3]",
      ),
    ).toThrow(/"tools\[3\]\.function\.parameters\.pattern"/);
  });
});
