// commandLine turns config values typed by a command's schema into the arguments a child
// process of that command is started with: round trips through the command's own parser
// for every command and for tricky values, and fails fast, naming the key, on a wrong one.
import { describe, expect, it } from "vitest";
import type { z } from "zod";
import { commandLine, serverLine } from "../../src/config/command-line.js";
import { getPath, setPath } from "../../src/config/layers.js";
import { CONFIG_SPECS } from "../../src/config/registry.js";
import type { CommandConfigSpec } from "../../src/config/resolve.js";
import {
  arrayElement,
  enumValues,
  kindOf,
  leafPaths,
  nodeAt,
  tupleItems,
  unionOptions,
  unwrap,
} from "../../src/config/schema-walk.js";
import { buildIndexSpec } from "../../src/config/schemas/build-index.js";
import { preprocessSpec } from "../../src/config/schemas/preprocess.js";
import { serveEngineSpec } from "../../src/config/schemas/serve-engine.js";
import { serveRetrieverSpec } from "../../src/config/schemas/serve-retriever.js";
import { trainSpec } from "../../src/config/schemas/train.js";
import { Rng } from "../../src/runtime/rng.js";
import { resolveLine } from "../helpers/command-line.js";

/** Text that a hand-written override would get wrong: spaces, list syntax, quotes, look-alikes. */
const TEXTS = [
  "nq",
  "/tmp/a dir/with spaces",
  "/data/a,b/corpus.jsonl",
  "/data/[x]/y{1}",
  "it's",
  'say "hi"',
  " padded ",
  "null",
  "~",
  "true",
  "no",
  "42",
  "1e-6",
  "-5",
  "a=b",
  "#not a comment",
  "- item",
  "key: value",
  "ünïcødé/路径",
  "http://127.0.0.1:8000/retrieve",
  "http://host:1/a,b?q=[1]&r='x'",
];
/** Both kinds of quote in one text: only outside lists (coerce's splitList has no escapes). */
const BOTH_QUOTES = `both ' and " quotes`;
const NUMBERS = [0, 1, 2, 3, -1, 0.5, 0.1, 0.999, 1e-6, 3e-4, 1e-8, 2.5e-7, -3.75, 42, 1024, 65535];

/** Values the schema node takes, the tricky ones included. */
function candidates(node: z.ZodType, inList = false): unknown[] {
  const { inner, nullable } = unwrap(node);
  const out: unknown[] = nullable ? [null] : [];
  const values = enumValues(inner);
  const kind = kindOf(inner);
  if (values) out.push(...values);
  else if (kind === "string") out.push(...TEXTS, ...(inList ? [] : [BOTH_QUOTES]));
  else if (kind === "number" || kind === "int") out.push(...NUMBERS);
  else if (kind === "boolean") out.push(true, false);
  else if (kind === "union") out.push(...(unionOptions(inner) ?? []).flatMap((o) => candidates(o)));
  return out.filter((v) => node.safeParse(v).success);
}

/** A random value the node takes (undefined when this test cannot make one). */
function draw(node: z.ZodType, rng: Rng): unknown {
  const { inner, nullable } = unwrap(node);
  const kind = kindOf(inner);
  const pick = <T>(items: T[]): T | undefined => items[rng.int(items.length)];
  if (nullable && rng.int(5) === 0) return null;
  for (let attempt = 0; attempt < 20; attempt++) {
    let value: unknown;
    if (kind === "array") {
      const element = arrayElement(inner) as z.ZodType;
      value = Array.from({ length: rng.int(4) }, () => pick(candidates(element, true)));
    } else if (kind === "tuple") {
      value = (tupleItems(inner) ?? []).map((item) => pick(candidates(item, true)));
    } else {
      value = pick(candidates(node));
    }
    if (value !== undefined && node.safeParse(value).success) return value;
  }
  return undefined;
}

describe("commandLine round trip", () => {
  for (const spec of Object.values(CONFIG_SPECS)) {
    it(`${spec.command}: random configs of tricky values read back as given`, () => {
      const rng = new Rng(spec.command.length * 7919 + 1);
      const leaves = leafPaths(spec.schema);
      for (let trial = 0; trial < 40; trial++) {
        const values: Record<string, unknown> = {};
        const given: [string[], unknown][] = [];
        for (const path of leaves) {
          if (rng.int(3) === 0) continue;
          const value = draw(nodeAt(spec.schema, path) as z.ZodType, rng);
          if (value === undefined) continue;
          setPath(values, path, value);
          given.push([path, value]);
        }
        const line = commandLine(spec as CommandConfigSpec, values);
        expect(line.command).toBe(spec.command);
        const back = resolveLine(line, { draft: true });
        for (const [path, value] of given) {
          expect(getPath(back, path), `${path.join(".")} from ${line.args.join(" ")}`).toEqual(
            value,
          );
        }
      }
    });
  }

  it("writes lists, nulls, numbers, booleans and nested sections in a form coerce reads exactly", () => {
    const values = {
      datasets: ["nq", "a,b", "[x]", "it's", 'say "hi"', " padded ", "null", "42", ""],
      input: BOTH_QUOTES,
      out: "/tmp/out dir",
      splits: null,
      strict: true,
      quiet: false,
    };
    // The empty dataset name is refused by the schema (min 1): everything else reads back.
    expect(() => commandLine(preprocessSpec, values)).toThrow(/"datasets\[8\]"/);
    values.datasets.pop();
    const line = commandLine(preprocessSpec, values);
    expect(resolveLine(line)).toMatchObject(values);
    expect(line.args).toContain("splits=null");
    expect(line.args).toContain("strict=true");

    const nested = commandLine(buildIndexSpec, {
      corpus: "/c/corpus.jsonl",
      out: "/o",
      bm25: { k1: 1.2, b: 0 },
      memory_mb: 1e-6,
    });
    expect(nested.args).toEqual([
      "corpus=/c/corpus.jsonl",
      "out=/o",
      "bm25.k1=1.2",
      "bm25.b=0",
      "memory_mb=0.000001",
    ]);
    expect(resolveLine(nested)).toMatchObject({ bm25: { k1: 1.2, b: 0 }, memory_mb: 1e-6 });

    const train = commandLine(
      trainSpec,
      {
        model: { path: "/models/a b" },
        actor: { betas: [0.9, 0.999] },
        data: { train_files: ["/d/x,1.parquet", "/d/[2].parquet"] },
        trainer: { resume: "/ckpt dir/global_step_3", logger: [] },
      },
      { configFile: "templates/configs/quickstart.yaml" },
    );
    expect(train.args.slice(0, 2)).toEqual(["--config", "templates/configs/quickstart.yaml"]);
    expect(resolveLine(train)).toMatchObject({
      model: { path: "/models/a b" },
      actor: { betas: [0.9, 0.999], lr: 3e-4 }, // lr from the config file
      data: { train_files: ["/d/x,1.parquet", "/d/[2].parquet"] },
      trainer: { resume: "/ckpt dir/global_step_3", logger: [] },
    });
  });

  it("leaves out undefined values and leaves required keys to the child", () => {
    const line = commandLine(serveRetrieverSpec, { index: "/i", corpus: undefined, topk: 2 });
    expect(line.args).toEqual(["index=/i", "topk=2"]);
  });

  it("serverLine has the child listen on the loopback at a free port", () => {
    const line = serverLine(serveEngineSpec, { model: "/m", device: "cpu" });
    expect(resolveLine(line)).toMatchObject({
      model: "/m",
      device: "cpu",
      host: "127.0.0.1",
      port: 0,
    });
  });
});

describe("commandLine checks the arguments against the callee's schema", () => {
  it("names a key the command does not have, with a suggestion", () => {
    expect(() =>
      commandLine(serveRetrieverSpec, { index: "/i", retriever_modle: "/e5" } as never),
    ).toThrow(
      /^the arguments of searchr1 serve-retriever: unknown key "retriever_modle" \(override retriever_modle=\/e5\); did you mean "retriever_model"\?$/,
    );
    expect(() => commandLine(trainSpec, { trainer: { treads: 2 } } as never)).toThrow(
      /unknown key "trainer.treads"/,
    );
  });

  it("names a value of the wrong type", () => {
    expect(() => commandLine(serveEngineSpec, { threads: "many" } as never)).toThrow(
      /^the arguments of searchr1 serve-engine: "threads" = "many" \(override threads=many\): expected integer or null$/,
    );
  });

  it("refuses a value that would not read back exactly", () => {
    expect(() =>
      commandLine(preprocessSpec, { datasets: [BOTH_QUOTES, "nq"], input: "/i", out: "/o" }),
    ).toThrow(/"datasets" = .* would read back as/);
  });
});
