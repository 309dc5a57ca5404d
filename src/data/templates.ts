import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import path from "node:path";
import { InputError } from "../runtime/errors.js";
import { packageRoot } from "../runtime/package-root.js";

const PLACEHOLDER = "{question}";

/** A prompt template: text with one or more `{question}` placeholders. */
export interface PromptTemplate {
  /** The built-in name, or the user's file path as given. */
  name: string;
  /** The file the text came from. */
  file: string;
  text: string;
}

/** The package's `templates/` folder. */
export function builtinTemplatesDir(): string {
  return path.join(packageRoot(), "templates");
}

/** Names of the built-in templates (`<templatesDir>/<name>.txt`), sorted. */
export function builtinTemplateNames(templatesDir: string): string[] {
  if (!existsSync(templatesDir)) return [];
  return readdirSync(templatesDir)
    .filter((f) => f.endsWith(".txt"))
    .map((f) => f.slice(0, -".txt".length))
    .sort();
}

/** Resolves a built-in template name, else a path to the user's template file. */
export function loadTemplate(nameOrFile: string, templatesDir: string): PromptTemplate {
  const builtins = builtinTemplateNames(templatesDir);
  let file: string;
  if (builtins.includes(nameOrFile)) {
    file = path.join(templatesDir, `${nameOrFile}.txt`);
  } else if (existsSync(nameOrFile)) {
    file = nameOrFile;
    if (!statSync(file).isFile()) {
      throw new InputError(
        `template ${file}: is not a file; expected a text file with ${PLACEHOLDER}`,
      );
    }
  } else {
    throw new InputError(
      `template ${nameOrFile}: no such file and not a built-in template; expected one of ` +
        `${builtins.join(", ")} or a path to a text file with ${PLACEHOLDER}`,
    );
  }
  const text = readFileSync(file, "utf8");
  if (!text.includes(PLACEHOLDER)) {
    throw new InputError(`template ${file}: has no ${PLACEHOLDER} placeholder`);
  }
  return { name: nameOrFile, file, text };
}

/** Replaces every `{question}`; split/join so `$` sequences in questions stay literal. */
export function renderTemplate(template: PromptTemplate, question: string): string {
  return template.text.split(PLACEHOLDER).join(question);
}
