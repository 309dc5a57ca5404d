import { readFileSync } from "node:fs";
import { UsageError } from "../runtime/errors.js";

/** The training command of a shell script, as `searchr1 config train --from-script` reads it. */
export interface ScriptCommand {
  /** The program the line runs (`python3 -m verl.trainer.main_ppo`, `searchr1 train`). */
  program: string;
  /** Its `key=value` arguments, variables expanded, in order. */
  overrides: string[];
  /** Its other arguments (flags), which only the command itself reads. */
  others: string[];
  /** The variables the script exports and the command line's own assignments. */
  env: Record<string, string>;
}

// The lines a Search-R1 or verl script trains with, or the same with searchr1 put in.
const PROGRAM = /(?:python3?\s+-m\s+verl\.trainer\.main_ppo\w*|searchr1\s+(?:train|eval))\b/;

/**
 * Reads the training command of a shell script the way bash would run its simple parts:
 * backslash-continued lines joined, `export NAME=value` and `NAME=value` lines tracked in
 * order, `$NAME` and `${NAME}` expanded outside single quotes, words split on blanks with
 * quotes removed, the words after the program up to a pipe or redirection taken as its
 * arguments. Anything else the script does (conditionals, loops, command substitution) is
 * not run; the variables it would set come from `env` (the caller's environment).
 */
export function readScriptCommand(
  file: string,
  env: Record<string, string | undefined>,
): ScriptCommand {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    throw new UsageError(`--from-script ${file}: ${(err as Error).message}`);
  }
  const vars: Record<string, string | undefined> = { ...env };
  const exported: Record<string, string> = {};
  const lines = text.replace(/\\\r?\n/g, " ").split(/\r?\n/);
  for (const line of lines) {
    const code = line.replace(/^\s+/, "");
    if (code.startsWith("#") || code === "") continue;
    const match = PROGRAM.exec(code);
    if (!match) {
      const assignment = /^(export\s+)?([A-Za-z_]\w*)=(.*)$/.exec(code);
      if (assignment) {
        const value = words(assignment[3] as string, vars)[0] ?? "";
        vars[assignment[2] as string] = value;
        if (assignment[1]) exported[assignment[2] as string] = value;
      }
      continue;
    }
    // NAME=value words before the program are the command's own environment.
    for (const word of words(code.slice(0, match.index), vars)) {
      const m = /^([A-Za-z_]\w*)=(.*)$/.exec(word);
      if (m) exported[m[1] as string] = m[2] as string;
    }
    const args = words(code.slice(match.index + match[0].length), vars, true);
    const isOverride = (w: string) => /^\+{0,2}[A-Za-z_][\w.-]*=/.test(w);
    return {
      program: match[0].replace(/\s+/g, " "),
      overrides: args.filter(isOverride),
      others: args.filter((w) => !isOverride(w)),
      env: exported,
    };
  }
  throw new UsageError(
    `--from-script ${file}: no training command found (a line running python3 -m verl.trainer.main_ppo or searchr1 train)`,
  );
}

/**
 * Splits shell text into words: quotes removed, variables expanded (not in single quotes);
 * with `stopAtPipe`, the words end at `|`, `;`, `&&` or a redirection (`2>&1`, `> file`).
 */
function words(
  text: string,
  vars: Record<string, string | undefined>,
  stopAtPipe = false,
): string[] {
  const out: string[] = [];
  let word: string | null = null;
  let quote: "'" | '"' | null = null;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i] as string;
    if (quote === "'") {
      if (ch === "'") quote = null;
      else word += ch;
      continue;
    }
    if (ch === "$" && /[A-Za-z_{]/.test(text[i + 1] ?? "")) {
      const m = /^\$(?:\{([A-Za-z_]\w*)\}|([A-Za-z_]\w*))/.exec(text.slice(i));
      if (m) {
        word = (word ?? "") + (vars[(m[1] ?? m[2]) as string] ?? "");
        i += m[0].length - 1;
        continue;
      }
    }
    if (quote === '"') {
      if (ch === '"') quote = null;
      else if (ch === "\\" && /["\\$`]/.test(text[i + 1] ?? "")) word = (word ?? "") + text[++i];
      else word += ch;
      continue;
    }
    if (ch === "'" || ch === '"') {
      quote = ch;
      word ??= "";
      continue;
    }
    if (/\s/.test(ch)) {
      if (word !== null) out.push(word);
      word = null;
      continue;
    }
    if (stopAtPipe && word === null && /^(?:[|;&<>]|\d>)/.test(text.slice(i, i + 2))) break;
    word = (word ?? "") + ch;
  }
  if (quote) throw new UsageError(`--from-script: unterminated ${quote} quote in: ${text.trim()}`);
  if (word !== null) out.push(word);
  return out;
}
