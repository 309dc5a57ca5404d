// Regenerates the config reference in README.md from the zod schemas (npm run docs:config).
import { readFileSync, writeFileSync } from "node:fs";
import { withConfigSection } from "../src/config/readme-section.js";
import { packageRoot } from "../src/runtime/package-root.js";

const file = `${packageRoot()}/README.md`;
writeFileSync(file, withConfigSection(readFileSync(file, "utf8")));
