import { existsSync, readFileSync, statSync } from "node:fs";
import { dirname, relative, resolve } from "node:path";
import { isMap, isScalar, isSeq, LineCounter, type Node, parseDocument } from "yaml";
import { UsageError } from "../runtime/errors.js";
import { emptyLayer, type Layer, setValue } from "./layers.js";

/**
 * Loads a YAML config file into layers, base files first. A file may name others in
 * `extends:` (a path or a list of paths, relative to the file itself); their values are
 * overridden by the extending file. Every key keeps its file:line:col for error messages.
 */
export function loadConfigFile(file: string): Layer[] {
  return loadChain(resolve(file), []);
}

function displayPath(abs: string): string {
  const rel = relative(process.cwd(), abs);
  return rel.startsWith("..") ? abs : rel;
}

function loadChain(abs: string, stack: string[]): Layer[] {
  if (stack.includes(abs)) {
    const cycle = [...stack.slice(stack.indexOf(abs)), abs].map(displayPath).join(" -> ");
    throw new UsageError(`config: extends cycle: ${cycle}`);
  }
  if (!existsSync(abs)) {
    const from = stack.length
      ? ` (extended by ${displayPath(stack[stack.length - 1] as string)})`
      : "";
    throw new UsageError(`config: file not found: ${displayPath(abs)}${from}`);
  }
  const name = displayPath(abs);
  if (!statSync(abs).isFile()) throw new UsageError(`config: not a file: ${name}`);
  const lineCounter = new LineCounter();
  const doc = parseDocument(readFileSync(abs, "utf8"), { lineCounter, prettyErrors: false });
  const err = doc.errors[0];
  if (err) {
    const pos = lineCounter.linePos(err.pos[0]);
    throw new UsageError(
      `${name}:${pos.line}:${pos.col}: invalid YAML: ${err.message.split("\n")[0]}`,
    );
  }
  const layer = emptyLayer();
  const root = doc.contents;
  if (root !== null && !isMap(root)) {
    throw new UsageError(`${name}: expected a mapping of config keys at the top level`);
  }
  const at = (node: Node | null | undefined) => {
    const { line, col } = lineCounter.linePos(node?.range?.[0] ?? 0);
    return { kind: "file" as const, file: name, line, col };
  };
  let bases: string[] = [];
  const walk = (map: Node, path: string[]) => {
    if (!isMap(map)) return;
    for (const pair of map.items) {
      const keyNode = pair.key as Node | null;
      const key = isScalar(keyNode) ? String(keyNode.value) : String(keyNode);
      const valueNode = pair.value as Node | null;
      if (path.length === 0 && key === "extends") {
        bases = extendsList(valueNode, name, at(keyNode));
        continue;
      }
      const keyPath = [...path, key];
      if (isMap(valueNode)) {
        // An empty mapping still counts as "set here"; its children refine it.
        setValue(layer, keyPath, {}, at(keyNode));
        walk(valueNode, keyPath);
      } else {
        const value = valueNode == null ? null : valueNode.toJSON();
        setValue(layer, keyPath, value, at(keyNode));
      }
    }
  };
  if (root) walk(root, []);
  const dir = dirname(abs);
  const baseLayers = bases.flatMap((b) => loadChain(resolve(dir, b), [...stack, abs]));
  return [...baseLayers, layer];
}

function extendsList(
  node: Node | null,
  file: string,
  pos: { line: number; col: number },
): string[] {
  const values = isSeq(node)
    ? node.items.map((i) => (isScalar(i) ? i.value : i))
    : [isScalar(node) ? node.value : node];
  if (!values.every((v): v is string => typeof v === "string" && v.length > 0)) {
    throw new UsageError(
      `${file}:${pos.line}:${pos.col}: extends: expected a file path or a list of file paths`,
    );
  }
  return values;
}
