import type { CommandConfigSpec } from "./resolve.js";
import { defaultAt, describeOf, leafPaths, nodeAt, typeName } from "./schema-walk.js";
import { VERL_ENV, VERL_KEYS } from "./verl-keys.js";

function cell(text: string): string {
  return text.replace(/\|/g, "\\|").replace(/\n/g, " ");
}

function formatDefault(value: unknown): string {
  if (value === undefined) return "**required**";
  return `\`${typeof value === "string" ? value : JSON.stringify(value)}\``;
}

/** One command's config reference as a Markdown table (its docs page, `config --reference`). */
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
  const keys = ["| key | type | default | meaning |", "|---|---|---|---|", ...rows].join("\n");
  return spec.verl ? `${keys}\n\n${verlReference()}` : keys;
}

/** The table of verl's and Search-R1's key names (verl-keys.ts), for the commands that read them. */
function verlReference(): string {
  const rows = Object.entries(VERL_KEYS).map(([key, entry]) => {
    let here: string;
    if ("to" in entry) {
      const also = Object.entries(entry.also ?? {}).map(
        ([k, v]) => `, and \`${k}: ${JSON.stringify(v)}\``,
      );
      here = `\`${entry.to}\`${also.join("")}`;
    } else if ("noEffect" in entry) here = `no effect (warns): ${entry.noEffect}`;
    else {
      const values = entry.only.map((v) => `\`${JSON.stringify(v)}\``).join(" or ");
      here = `accepted at ${values}, refused otherwise: ${entry.why}`;
    }
    return `| \`${key}\` | ${cell(here)} |`;
  });
  const env = Object.entries(VERL_ENV).map(
    ([name, why]) => `| env \`${name}\` | ${cell(`no effect (warns): ${why}`)} |`,
  );
  return [
    "verl's and Search-R1's names (their scripts' overrides, `+key=` additions and YAML files in verl's nested layout) are read as the keys below; this project's own key wins where a name is both. A config that uses any of them gets Search-R1's defaults (its `ppo_trainer.yaml`) for the keys it leaves unset, the KL in the reward exactly when not in the loss, as there. The batch sizes are global, divided by the data-parallel ranks, as verl's.",
    "",
    "| verl / Search-R1 key | here |",
    "|---|---|",
    ...rows,
    ...env,
  ].join("\n");
}
