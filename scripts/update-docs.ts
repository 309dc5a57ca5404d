// Rewrites the manual's generated sections (npm run docs): each command page's help text and
// config key table, from the command tree, the schemas and the native executables' --help.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { packageRoot } from "../src/runtime/package-root.js";
import { generatedSections, NATIVE_PAGES, nativeBuilt, withSection } from "./docs/sections.js";

const root = packageRoot();
const pages = new Map<string, string>();
for (const { page, name, body } of generatedSections()) {
  const text = pages.get(page) ?? readFileSync(join(root, page), "utf8");
  pages.set(page, withSection(text, page, name, body));
}
for (const [page, text] of pages) {
  const file = join(root, page);
  if (readFileSync(file, "utf8") !== text) {
    writeFileSync(file, text);
    process.stdout.write(`rewrote ${page}\n`);
  }
}
for (const name of NATIVE_PAGES) {
  if (!nativeBuilt(name)) {
    process.stdout.write(`docs/commands/${name}.md: help left as it was (${name} is not built)\n`);
  }
}
