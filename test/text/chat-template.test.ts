import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { InputError, UsageError } from "../../src/runtime/errors.js";
import { ChatTemplate, strftime } from "../../src/text/chat-template.js";
import { ModelTokenizer } from "../../src/text/model-tokenizer.js";
import {
  type ChatCase,
  copyTokenizer,
  reference,
  referenceNow,
  type TokenizerName,
  templateFile,
  tempRoot,
  tokenizerDir,
} from "./reference.js";

/**
 * Chat prompts against transformers 5's apply_chat_template (reference.json): the rendered
 * text and its ids, for the tokenizers' own templates (Qwen2 ChatML inside
 * tokenizer_config.json; Llama 3.2 Instruct in chat_template.jinja) and real templates of
 * Qwen2.5, Llama 3, 3.1 and Llama 2, over conversations with system messages, several
 * turns, non-ASCII text, surrounding whitespace and Search-R1's prompt.
 */

let root: string;
const models = new Map<TokenizerName, ModelTokenizer>();
const model = (name: TokenizerName) => {
  let m = models.get(name);
  if (!m) {
    m = ModelTokenizer.load(tokenizerDir(name));
    models.set(name, m);
  }
  return m;
};

beforeAll(() => {
  root = tempRoot();
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

const label = (c: ChatCase) =>
  `${c.tokenizer} ${c.template} ${c.conversation}${c.add_generation_prompt ? " +gen" : ""}`;

describe("apply_chat_template: identical text and ids", () => {
  it("the reference covers every template, conversation and add_generation_prompt", () => {
    const templates = new Set(reference.chat.map((c) => `${c.tokenizer}/${c.template}`));
    expect(templates.size).toBe(6);
    expect(reference.chat).toHaveLength(templates.size * 8 * 2);
    expect(reference.chat.filter((c) => c.error)).toHaveLength(2);
  });

  it.each(reference.chat.map((c) => [label(c), c] as const))("%s", async (_, c) => {
    const m = model(c.tokenizer);
    const messages = reference.conversations[c.conversation];
    if (!messages) throw new Error(`no conversation ${c.conversation}`);
    const options = { addGenerationPrompt: c.add_generation_prompt, now: referenceNow };
    const render = () =>
      c.template === "own"
        ? m.applyChatTemplate(messages, options)
        : new ChatTemplate(readFileSync(templateFile(c.template), "utf8"), c.template).render(
            messages,
            { ...options, specialTokens: m.specialTokens },
          );
    if (c.error !== undefined) {
      expect(render).toThrow(InputError);
      expect(render).toThrow(
        `${c.template}: the chat template refused the conversation: ${c.error}`,
      );
      return;
    }
    const text = render();
    expect(text).toBe(c.text);
    expect(await m.encode(text, { addSpecialTokens: false })).toEqual(c.ids);
    if (c.template === "own") expect(await m.encodeChat(messages, options)).toEqual(c.ids);
  });
});

describe("Jinja features real templates use, as Python's Jinja2 renders them", () => {
  const edge = reference.edge;
  it.each(edge.cases.map((c) => [c.name, c] as const))("%s", (_, c) => {
    const messages = reference.conversations[edge.conversation];
    if (!messages) throw new Error("no conversation");
    const render = () =>
      new ChatTemplate(c.template, c.name).render(messages, {
        addGenerationPrompt: edge.add_generation_prompt,
        specialTokens: model(edge.tokenizer).specialTokens,
        variables: edge.variables,
        now: referenceNow,
      });
    if (c.error !== undefined) expect(render).toThrow(`refused the conversation: ${c.error}`);
    else expect(render()).toBe(c.text);
  });

  it("extra variables reach the template (Llama 3.2's date_string)", () => {
    const v = reference.variables;
    const messages = reference.conversations[v.conversation];
    if (!messages) throw new Error("no conversation");
    const text = model(v.tokenizer).applyChatTemplate(messages, {
      addGenerationPrompt: true,
      variables: v.variables,
    });
    expect(text).toBe(v.text);
  });

  it("strftime formats as Python's strftime in the C locale", () => {
    for (const { format, text } of reference.strftime) {
      expect(strftime(referenceNow(), format), format).toBe(text);
    }
    expect(strftime(new Date(2024, 11, 31, 23, 0, 0), "%j %I %p %a")).toBe("366 11 PM Tue");
    expect(strftime(new Date(2024, 0, 1, 0, 0, 0), "%I %p %Q")).toBe("12 AM %Q");
  });

  it("strftime_now reads the real clock by default", () => {
    const t = new ChatTemplate("{{ strftime_now('%Y') }}", "t");
    const year = new Date().getFullYear();
    expect(Number(t.render([{ role: "user", content: "" }], { addGenerationPrompt: false }))).toBe(
      year,
    );
  });
});

describe("where the template comes from (transformers 5's rules)", () => {
  it("chat_template.jinja wins over tokenizer_config.json's chat_template", () => {
    const ref = reference.template_file_wins;
    const dir = copyTokenizer(root, "qwen-bpe", ["tokenizer.json", "tokenizer_config.json"]);
    writeFileSync(
      join(dir, "chat_template.jinja"),
      readFileSync(templateFile(ref.template), "utf8"),
    );
    const m = ModelTokenizer.load(dir);
    expect(m.chatTemplate?.origin).toBe(join(dir, "chat_template.jinja"));
    const messages = reference.conversations[ref.conversation];
    if (!messages) throw new Error("no conversation");
    expect(m.applyChatTemplate(messages, { addGenerationPrompt: true })).toBe(ref.text);
  });

  it("the llama3 folder's template is its chat_template.jinja; qwen-bpe's is in the config", () => {
    expect(model("llama3").chatTemplate?.origin).toBe(
      join(tokenizerDir("llama3"), "chat_template.jinja"),
    );
    expect(model("qwen-bpe").chatTemplate?.origin).toBe(
      `${join(tokenizerDir("qwen-bpe"), "tokenizer_config.json")} ("chat_template")`,
    );
  });

  it("a .jinja file with CRLF line ends reads as Python's text mode reads it", () => {
    const dir = copyTokenizer(root, "qwen-bpe", ["tokenizer.json"]);
    writeFileSync(
      join(dir, "chat_template.jinja"),
      "{% for m in messages %}\r\n{{ m.content }}\r\n{% endfor %}",
    );
    const m = ModelTokenizer.load(dir);
    const text = m.applyChatTemplate(
      [
        { role: "user", content: "a" },
        { role: "user", content: "b" },
      ],
      { addGenerationPrompt: false },
    );
    expect(text).toBe("a\nb\n");
  });

  it("named templates: the one named default, and an error without one", () => {
    const dir = copyTokenizer(root, "qwen-bpe", ["tokenizer.json"]);
    const path = join(dir, "tokenizer_config.json");
    writeFileSync(
      path,
      JSON.stringify({
        chat_template: [
          { name: "tool_use", template: "T" },
          { name: "default", template: "D{{ messages | length }}" },
        ],
      }),
    );
    const m = ModelTokenizer.load(dir);
    expect(m.chatTemplate?.origin).toBe(`${path} (chat_template "default")`);
    expect(
      m.applyChatTemplate([{ role: "user", content: "x" }], { addGenerationPrompt: true }),
    ).toBe("D1");
    writeFileSync(path, JSON.stringify({ chat_template: [{ name: "tool_use", template: "T" }] }));
    expect(() => ModelTokenizer.load(dir)).toThrow(
      `${dir}: chat templates tool_use but none named "default"`,
    );
    writeFileSync(path, JSON.stringify({ chat_template: [{ name: "x" }] }));
    expect(() => ModelTokenizer.load(dir)).toThrow(
      `${path}: chat_template[0]: expected {"name": string, "template": string}`,
    );
    writeFileSync(path, JSON.stringify({ chat_template: 3 }));
    expect(() => ModelTokenizer.load(dir)).toThrow(`${path}: chat_template: expected`);
  });

  it("additional_chat_templates/ with chat_template.jinja: the .jinja file is the default", () => {
    const dir = copyTokenizer(root, "qwen-bpe", ["tokenizer.json", "tokenizer_config.json"]);
    mkdirSync(join(dir, "additional_chat_templates"));
    writeFileSync(join(dir, "additional_chat_templates", "tool_use.jinja"), "T");
    expect(() => ModelTokenizer.load(dir)).toThrow(/none named "default"/);
    writeFileSync(join(dir, "chat_template.jinja"), "D");
    const m = ModelTokenizer.load(dir);
    expect(
      m.applyChatTemplate([{ role: "user", content: "x" }], { addGenerationPrompt: false }),
    ).toBe("D");
  });
});

describe("errors name the file", () => {
  it("a model without a chat template", () => {
    const m = model("llama-sp");
    expect(m.chatTemplate).toBeNull();
    const dir = tokenizerDir("llama-sp");
    const render = () =>
      m.applyChatTemplate([{ role: "user", content: "x" }], { addGenerationPrompt: true });
    expect(render).toThrow(InputError);
    expect(render).toThrow(
      `${dir}: the model has no chat template (no chat_template.jinja, and no "chat_template" ` +
        `in ${dir}/tokenizer_config.json)`,
    );
  });

  it("a template that does not parse, or fails while rendering", () => {
    const dir = copyTokenizer(root, "qwen-bpe", ["tokenizer.json"]);
    const file = join(dir, "chat_template.jinja");
    writeFileSync(file, "{% for m in messages %}{{ m.content }}");
    expect(() => ModelTokenizer.load(dir)).toThrow(InputError);
    expect(() => ModelTokenizer.load(dir)).toThrow(`${file}: the chat template does not parse (`);
    writeFileSync(file, "{{ messages[0].content.nope() }}");
    const m = ModelTokenizer.load(dir);
    expect(() =>
      m.applyChatTemplate([{ role: "user", content: "x" }], { addGenerationPrompt: false }),
    ).toThrow(`${file}: the chat template failed (`);
  });

  it("no messages, or a variable the renderer sets itself", () => {
    const t = new ChatTemplate("{{ messages | length }}", "t");
    expect(() => t.render([], { addGenerationPrompt: true })).toThrow(UsageError);
    expect(() =>
      t.render([{ role: "user", content: "x" }], {
        addGenerationPrompt: true,
        variables: { messages: [] },
      }),
    ).toThrow("chat template variable messages: set by the renderer itself");
  });

  it("variables may shadow globals and special tokens, as Python's render(**kwargs)", () => {
    const t = new ChatTemplate("{{ range }}|{{ bos_token }}", "t");
    expect(
      t.render([{ role: "user", content: "x" }], {
        addGenerationPrompt: true,
        specialTokens: { bos_token: "<s>" },
        variables: { range: "R", bos_token: "<B>" },
      }),
    ).toBe("R|<B>");
  });
});
