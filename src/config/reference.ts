import type { CommandConfigSpec } from "./resolve.js";
import { defaultAt, describeOf, leafPaths, nodeAt, typeName } from "./schema-walk.js";

function cell(text: string): string {
  return text.replace(/\|/g, "\\|").replace(/\n/g, " ");
}

function formatDefault(value: unknown): string {
  if (value === undefined) return "**required**";
  return `\`${typeof value === "string" ? value : JSON.stringify(value)}\``;
}

/** The config reference of one command as a Markdown table (README and `config --reference`). */
export function configReference(spec: CommandConfigSpec): string {
  const envOf = new Map(Object.entries(spec.env).map(([name, key]) => [key, name]));
  const rows = leafPaths(spec.schema).map((path) => {
    const key = path.join(".");
    const node = nodeAt(spec.schema, path);
    if (!node) throw new Error(`no schema node at ${key}`);
    const env = envOf.get(key);
    const about = [describeOf(node) ?? "", env ? `env \`${env}\`` : ""].filter(Boolean).join("; ");
    return `| \`${key}\` | ${cell(typeName(node))} | ${cell(formatDefault(defaultAt(spec.schema, path)))} | ${cell(about)} |`;
  });
  return ["| key | type | default | meaning |", "|---|---|---|---|", ...rows].join("\n");
}
