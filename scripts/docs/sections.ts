// The manual's generated sections: each command's page under docs/commands/ holds its
// `--help` text and its config key table between markers, written from the command's own
// definition (the command tree of cli/program.ts, the zod schemas of src/config/, the
// native executables' own --help). `npm run docs` rewrites them (scripts/update-docs.ts);
// test/readme.test.ts checks they are current. It lives in scripts/ because it reads the
// command tree from cli/, the top floor, which nothing under src/ may import.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import type { Command } from "commander";
import { buildProgram } from "../../cli/program.js";
import { configReference } from "../../src/config/reference.js";
import { CONFIG_SPECS } from "../../src/config/registry.js";
import { nativeDir } from "../../src/runtime/native-executable.js";

/** What a generated section holds. */
export type SectionName = "help" | "config";

export interface GeneratedSection {
  /** The page, relative to the package root (docs/commands/train.md). */
  page: string;
  name: SectionName;
  /** The text between the markers. */
  body: string;
}

/** The native executables whose help is generated into their own pages. */
export const NATIVE_PAGES = ["searchr1-trainer", "searchr1-index"] as const;

/** Help texts are wrapped as a pipe or a file gets them (commander's width without a terminal). */
const HELP_WIDTH = 80;

export function beginMarker(name: SectionName): string {
  return `<!-- generated:${name}:begin (npm run docs writes this section; do not edit it) -->`;
}

export function endMarker(name: SectionName): string {
  return `<!-- generated:${name}:end -->`;
}

/**
 * A command's page: docs/commands/<name>.md, named for the shorter name users type when the
 * command has an alias (convert-ckpt, alias convert: docs/commands/convert.md).
 */
export function commandPage(cmd: Command): string {
  const names = [cmd.name(), ...cmd.aliases()].sort((a, b) => a.length - b.length);
  return `docs/commands/${names[0]}.md`;
}

/** A command's `--help` as it prints it, without a terminal. */
function helpOf(cmd: Command): string {
  let out = "";
  cmd.configureOutput({
    writeOut: (s) => {
      out += s;
    },
    getOutHelpWidth: () => HELP_WIDTH,
    getOutHasColors: () => false,
  });
  cmd.outputHelp();
  return out;
}

/** A help text as a code block, headed by the line that prints it. */
function helpBlock(commandLine: string, text: string): string {
  return `\`\`\`text\n$ ${commandLine} --help\n${text.trimEnd()}\n\`\`\``;
}

/** The subcommand names listed under "Commands:" in a native executable's --help. */
function nativeSubcommands(text: string): string[] {
  const lines = text.split("\n");
  const start = lines.findIndex((l) => l.trim() === "Commands:");
  if (start < 0) return [];
  const names: string[] = [];
  for (const line of lines.slice(start + 1)) {
    const m = /^\s+([a-z][\w-]*)\s/.exec(line);
    if (!m) break;
    names.push(m[1] as string);
  }
  return names;
}

function nativeHelp(executable: string, args: string[]): string {
  const r = spawnSync(executable, [...args, "--help"], { encoding: "utf8" });
  if (r.status !== 0) {
    throw new Error(`${executable} ${args.join(" ")} --help exited ${r.status}: ${r.stderr}`);
  }
  return r.stdout;
}

/** Whether a native executable is built here (its page's help is generated only then). */
export function nativeBuilt(name: (typeof NATIVE_PAGES)[number]): boolean {
  return existsSync(join(nativeDir(), name));
}

/** The help section of a native executable's page: its --help, then each subcommand's. */
function nativeHelpSection(name: (typeof NATIVE_PAGES)[number]): string {
  const exe = join(nativeDir(), name);
  const top = nativeHelp(exe, []);
  const blocks = [helpBlock(name, top)];
  for (const sub of nativeSubcommands(top)) {
    blocks.push(helpBlock(`${name} ${sub}`, nativeHelp(exe, [sub])));
  }
  return blocks.join("\n\n");
}

/**
 * Every generated section of the manual: for each command of the tree its help text, and
 * for each command with a config its key table; for each built native executable its help.
 */
export function generatedSections(): GeneratedSection[] {
  const sections: GeneratedSection[] = [];
  const program = buildProgram();
  for (const cmd of program.commands) {
    const page = commandPage(cmd);
    sections.push({ page, name: "help", body: helpBlock(`searchr1 ${cmd.name()}`, helpOf(cmd)) });
    const spec = CONFIG_SPECS[cmd.name()];
    if (spec) sections.push({ page, name: "config", body: configReference(spec) });
  }
  for (const name of NATIVE_PAGES) {
    if (nativeBuilt(name)) {
      sections.push({
        page: `docs/commands/${name}.md`,
        name: "help",
        body: nativeHelpSection(name),
      });
    }
  }
  return sections;
}

/** The body of a page's generated section, or undefined when the page has no such markers. */
export function sectionIn(text: string, name: SectionName): string | undefined {
  const begin = text.indexOf(beginMarker(name));
  const end = text.indexOf(endMarker(name));
  if (begin < 0 || end < begin) return undefined;
  return text.slice(begin + beginMarker(name).length, end).replace(/^\n+|\n+$/g, "");
}

/** A page's text with its generated section replaced; the markers must be there already. */
export function withSection(text: string, page: string, name: SectionName, body: string): string {
  const begin = text.indexOf(beginMarker(name));
  const end = text.indexOf(endMarker(name));
  if (begin < 0 || end < begin) {
    throw new Error(`${page} has no ${beginMarker(name)} ... ${endMarker(name)} markers`);
  }
  return `${text.slice(0, begin)}${beginMarker(name)}\n\n${body}\n\n${text.slice(end)}`;
}
