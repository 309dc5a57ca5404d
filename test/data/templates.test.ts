import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  builtinTemplateNames,
  builtinTemplatesDir,
  loadTemplate,
  renderTemplate,
} from "../../src/data/templates.js";
import { InputError } from "../../src/runtime/errors.js";
import { put, tempDir } from "./helpers.js";

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

// Written out here, not read from templates/, so the test pins the exact Search-R1 text.
const SEARCH_R1 =
  "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new information. After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> and it will return the top searched results between <information> and </information>. You can search as many times as your want. If you find no further external knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n";
// verl's DEFAULT_USER_CONTENT_PREFIX (examples/data_preprocess/preprocess_search_r1_dataset.py)
// + question: no newline after it.
const VERL_TOOL_CALL =
  "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new information. After reasoning, if you find you lack some knowledge, you can call a search engine by <tool_call> query </tool_call> and it will return the top searched results between <tool_response> and </tool_response>. You can search as many times as your want. If you find no further external knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}";
const R1_NO_SEARCH =
  "Answer the given question. You should first have a reasoning process in mind and then provides the answer. Show your reasoning in <think> </think> tags and return the final answer in <answer> </answer> tags, for example <answer> Beijing </answer>. Question: {question}\n";

describe("prompt templates", () => {
  let tmp: ReturnType<typeof tempDir>;
  beforeEach(() => {
    tmp = tempDir();
  });
  afterEach(() => tmp.cleanup());

  it("finds the package's templates folder from the module location", () => {
    expect(builtinTemplatesDir()).toBe(path.join(repoRoot, "templates"));
    expect(builtinTemplateNames(builtinTemplatesDir())).toEqual([
      "r1-no-search",
      "search-r1",
      "verl-tool-call",
    ]);
  });

  it("ships the Search-R1 prompts byte for byte, ending in exactly one newline, and verl's without one", () => {
    const dir = builtinTemplatesDir();
    expect(readFileSync(path.join(dir, "verl-tool-call.txt"), "utf8")).toBe(VERL_TOOL_CALL);
    expect(readFileSync(path.join(dir, "search-r1.txt"), "utf8")).toBe(SEARCH_R1);
    expect(readFileSync(path.join(dir, "r1-no-search.txt"), "utf8")).toBe(R1_NO_SEARCH);
    expect(loadTemplate("search-r1", dir).text).toBe(SEARCH_R1);
  });

  it("replaces every {question} and keeps $ sequences in the question literal", () => {
    const file = put(path.join(tmp.dir, "two.txt"), "Q: {question} / again: {question}\n");
    const template = loadTemplate(file, builtinTemplatesDir());
    expect(template.file).toBe(file);
    expect(renderTemplate(template, "costs $& $1?")).toBe(
      "Q: costs $& $1? / again: costs $& $1?\n",
    );
  });

  it("names the file that has no {question} placeholder", () => {
    const file = put(path.join(tmp.dir, "bad.txt"), "Answer: {q}\n");
    expect(() => loadTemplate(file, builtinTemplatesDir())).toThrow(InputError);
    expect(() => loadTemplate(file, builtinTemplatesDir())).toThrow(
      `template ${file}: has no {question} placeholder`,
    );
  });

  it("lists the built-in names when the value is neither a name nor a file", () => {
    const missing = path.join(tmp.dir, "nope.txt");
    expect(() => loadTemplate(missing, builtinTemplatesDir())).toThrow(
      `template ${missing}: no such file and not a built-in template; expected one of r1-no-search, search-r1, verl-tool-call or a path`,
    );
    expect(() => loadTemplate("search-r2", builtinTemplatesDir())).toThrow(
      /template search-r2: .*r1-no-search, search-r1/,
    );
  });

  it("rejects a folder given as the template file", () => {
    expect(() => loadTemplate(tmp.dir, builtinTemplatesDir())).toThrow(
      `template ${tmp.dir}: is not a file`,
    );
  });
});
