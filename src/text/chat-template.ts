/**
 * Chat templates: the Jinja text a model folder ships (chat_template.jinja, or
 * "chat_template" in tokenizer_config.json), rendered with `@huggingface/jinja` the way
 * transformers' `apply_chat_template` renders it with Python's Jinja2 (trim_blocks,
 * lstrip_blocks, loop controls; `{% generation %}` tags kept as plain text).
 *
 * The template sees what transformers passes: `messages`, `add_generation_prompt`,
 * `tools` (the OpenAI-style function schemas given, else none) and `documents` (none), the named
 * special tokens of tokenizer_config.json (`bos_token`, `eos_token`, ...), any extra
 * variables (transformers' `**kwargs`, e.g. `enable_thinking` or `date_string`), and the
 * globals `raise_exception(message)` and `strftime_now(format)` (local time, formatted as
 * Python's strftime does in the C locale: Llama 3.2's "Today Date: 07 Mar 2025").
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { Environment, Interpreter, Template } from "@huggingface/jinja";
import { InputError, UsageError } from "../runtime/errors.js";
import type { TokenizerConfig } from "./tokenizer-config.js";

/** One message of a conversation; templates may read more fields (tool_calls, name, ...). */
export interface ChatMessage {
  role: string;
  content: string;
  [field: string]: unknown;
}

/**
 * An OpenAI-style function tool, as apply_chat_template's `tools=` takes a dict: the
 * template writes it with `tojson`, so its keys keep the order they were given in.
 */
export interface ToolSchema {
  type: string;
  function: {
    name: string;
    description?: string;
    parameters?: Record<string, unknown>;
    [field: string]: unknown;
  };
  [field: string]: unknown;
}

export interface RenderOptions {
  /** Append the opening of an assistant turn (transformers' `add_generation_prompt`). */
  addGenerationPrompt: boolean;
  /**
   * The tools the template may describe (transformers' `tools=`: JSON schemas, usually
   * ToolSchemas; absent = None, and an empty list is falsy in the template as in Python).
   */
  tools?: readonly Record<string, unknown>[];
  /** Named special tokens (`bos_token`, ...), as `TokenizerConfig.specialTokens`. */
  specialTokens?: Record<string, string>;
  /** More template variables (they override special tokens of the same name). */
  variables?: Record<string, unknown>;
  /** The clock `strftime_now` reads (default: now). */
  now?: () => Date;
}

/** Variables apply_chat_template sets itself; passing them as extras is an error there too. */
const RESERVED = ["messages", "add_generation_prompt", "tools", "documents"];

/** Thrown by the template's `raise_exception(message)`. */
class TemplateRaised extends Error {}

export class ChatTemplate {
  private readonly template: Template;

  /**
   * Parses `source`; `origin` names where it came from (a file, or a file and key) in
   * errors. An InputError naming the origin when the text does not parse.
   */
  constructor(
    readonly source: string,
    readonly origin: string,
  ) {
    try {
      this.template = new Template(source);
    } catch (err) {
      throw new InputError(`${origin}: the chat template does not parse (${message(err)})`);
    }
  }

  /** The prompt text, as `apply_chat_template(messages, tokenize=False, ...)` gives it. */
  render(messages: readonly ChatMessage[], options: RenderOptions): string {
    if (messages.length === 0) {
      throw new UsageError("a chat template needs at least one message (the list is empty)");
    }
    for (const name of Object.keys(options.variables ?? {})) {
      if (RESERVED.includes(name)) {
        throw new UsageError(`chat template variable ${name}: set by the renderer itself`);
      }
    }
    const now = options.now ?? (() => new Date());
    // The globals @huggingface/jinja's Template.render declares (its setupGlobals is not
    // exported), with transformers' raise_exception and strftime_now. Variables go in a
    // child scope, so that they may shadow a global as Python's render(**kwargs) allows.
    const globals = new Environment();
    for (const [name, value] of [
      ["true", true],
      ["false", false],
      ["none", null],
      ["True", true],
      ["False", false],
      ["None", null],
    ] as const) {
      globals.set(name, value);
    }
    globals.set("range", range);
    globals.set("raise_exception", (text: unknown) => {
      throw new TemplateRaised(String(text));
    });
    globals.set("strftime_now", (format: unknown) => strftime(now(), String(format)));
    const scope = new Environment(globals);
    const context: Record<string, unknown> = {
      ...options.specialTokens,
      ...options.variables,
      messages,
      tools: options.tools ?? null,
      documents: null,
      add_generation_prompt: options.addGenerationPrompt,
    };
    for (const [name, value] of Object.entries(context)) scope.set(name, value);
    try {
      const result = new Interpreter(scope).run(this.template.parsed);
      return String(result.value);
    } catch (err) {
      if (err instanceof TemplateRaised) {
        throw new InputError(
          `${this.origin}: the chat template refused the conversation: ${err.message}`,
        );
      }
      throw new InputError(`${this.origin}: the chat template failed (${message(err)})`);
    }
  }
}

/**
 * The chat template of a model folder, found as transformers 5 finds it: chat_template.jinja
 * (what transformers 5's save_pretrained writes) and `additional_chat_templates/*.jinja` win
 * over "chat_template" in tokenizer_config.json; of several named templates, "default" is
 * used. Null when the folder has none; an InputError when it has named ones but no default.
 */
export function findChatTemplate(dir: string, config: TokenizerConfig): ChatTemplate | null {
  const named = new Map<string, { source: string; origin: string }>();
  const file = join(dir, "chat_template.jinja");
  if (existsSync(file)) named.set("default", { source: readTemplateFile(file), origin: file });
  const extraDir = join(dir, "additional_chat_templates");
  if (existsSync(extraDir) && statSync(extraDir).isDirectory()) {
    for (const name of readdirSync(extraDir).sort()) {
      if (!name.endsWith(".jinja")) continue;
      const path = join(extraDir, name);
      named.set(name.slice(0, -".jinja".length), { source: readTemplateFile(path), origin: path });
    }
  }
  if (named.size === 0 && config.chatTemplate !== null && config.path !== null) {
    if (typeof config.chatTemplate === "string") {
      return new ChatTemplate(config.chatTemplate, `${config.path} ("chat_template")`);
    }
    for (const [name, source] of Object.entries(config.chatTemplate)) {
      named.set(name, { source, origin: `${config.path} (chat_template "${name}")` });
    }
  }
  if (named.size === 0) return null;
  const chosen = named.get("default");
  if (!chosen) {
    throw new InputError(
      `${dir}: chat templates ${[...named.keys()].join(", ")} but none named "default" ` +
        "(transformers picks the default one)",
    );
  }
  return new ChatTemplate(chosen.source, chosen.origin);
}

/** Python reads template files in text mode: "\r\n" and "\r" become "\n". */
function readTemplateFile(path: string): string {
  return readFileSync(path, "utf8").replace(/\r\n?/g, "\n");
}

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Python's range(stop) / range(start, stop[, step]). */
function range(start: number, stop?: number, step = 1): number[] {
  if (stop === undefined) [start, stop] = [0, start];
  if (step === 0) throw new Error("range() arg 3 must not be zero");
  const out: number[] = [];
  for (let i = start; step > 0 ? i < stop : i > stop; i += step) out.push(i);
  return out;
}

const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const MONTHS = [
  "January",
  "February",
  "March",
  "April",
  "May",
  "June",
  "July",
  "August",
  "September",
  "October",
  "November",
  "December",
];

/**
 * `date.strftime(format)` as Python gives it in the C locale (English names; the local time
 * of `date`), for the directives chat templates use: %a %A %b %B %d %e %H %I %j %m %M %p
 * %S %y %Y %%, and glibc's "-" flag for no padding (%-d). Others are left as written.
 */
export function strftime(date: Date, format: string): string {
  const startOfYear = new Date(date.getFullYear(), 0, 1);
  const dayOfYear = Math.round((dateOnly(date) - dateOnly(startOfYear)) / 86_400_000) + 1;
  const hour12 = date.getHours() % 12 === 0 ? 12 : date.getHours() % 12;
  return format.replace(/%(-?)([aAbBdeHIjmMpSyY%])/g, (_, flag: string, d: string) => {
    const num = (n: number, width: number, pad = "0") =>
      flag === "-" ? String(n) : String(n).padStart(width, pad);
    switch (d) {
      case "a":
        return (DAYS[date.getDay()] as string).slice(0, 3);
      case "A":
        return DAYS[date.getDay()] as string;
      case "b":
        return (MONTHS[date.getMonth()] as string).slice(0, 3);
      case "B":
        return MONTHS[date.getMonth()] as string;
      case "d":
        return num(date.getDate(), 2);
      case "e":
        return num(date.getDate(), 2, " ");
      case "H":
        return num(date.getHours(), 2);
      case "I":
        return num(hour12, 2);
      case "j":
        return num(dayOfYear, 3);
      case "m":
        return num(date.getMonth() + 1, 2);
      case "M":
        return num(date.getMinutes(), 2);
      case "p":
        return date.getHours() < 12 ? "AM" : "PM";
      case "S":
        return num(date.getSeconds(), 2);
      case "y":
        return num(date.getFullYear() % 100, 2);
      case "Y":
        return String(date.getFullYear());
      default:
        return "%";
    }
  });
}

/** Milliseconds of the local date at midnight, as UTC (day arithmetic without DST). */
function dateOnly(date: Date): number {
  return Date.UTC(date.getFullYear(), date.getMonth(), date.getDate());
}
