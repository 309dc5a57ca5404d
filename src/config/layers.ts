/**
 * A config layer is one source of values (defaults, a YAML file, env vars, flags,
 * overrides) with where each key came from, so that an error can name its origin.
 */
export type Origin =
  | { kind: "file"; file: string; line: number; col: number }
  | { kind: "env"; name: string }
  | { kind: "flag"; flag: string }
  | { kind: "argument"; name: string }
  | { kind: "override"; text: string }
  | { kind: "defaults"; name: string };

export interface Layer {
  values: Record<string, unknown>;
  /** Dotted key path → where it was set. */
  origins: Map<string, Origin>;
}

export function emptyLayer(): Layer {
  return { values: {}, origins: new Map() };
}

export function formatOrigin(origin: Origin | undefined): string {
  if (!origin) return "default";
  switch (origin.kind) {
    case "file":
      return `${origin.file}:${origin.line}:${origin.col}`;
    case "env":
      return `env ${origin.name}`;
    case "flag":
      return `flag ${origin.flag}`;
    case "argument":
      return `argument <${origin.name}>`;
    case "override":
      return `override ${origin.text}`;
    case "defaults":
      return `default of ${origin.name}`;
  }
}

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** The value at a key path; numeric parts index lists (as in zod issue paths). */
export function getPath(obj: unknown, path: readonly PropertyKey[]): unknown {
  let cur = obj;
  for (const key of path) {
    if (typeof cur !== "object" || cur === null) return undefined;
    cur = (cur as Record<PropertyKey, unknown>)[key];
  }
  return cur;
}

/** Sets a value, creating intermediate objects; a scalar in the way is replaced. */
export function setPath(obj: Record<string, unknown>, path: readonly string[], value: unknown) {
  let cur = obj;
  for (const key of path.slice(0, -1)) {
    if (!isPlainObject(cur[key])) cur[key] = {};
    cur = cur[key] as Record<string, unknown>;
  }
  const last = path[path.length - 1];
  if (last !== undefined) cur[last] = value;
}

export function setValue(layer: Layer, path: readonly string[], value: unknown, origin: Origin) {
  setPath(layer.values, path, value);
  layer.origins.set(path.join("."), origin);
}

/** Deep merge, later layers win; objects merge key by key, lists and scalars replace. */
export function mergeValues(layers: readonly Layer[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const layer of layers) mergeInto(out, layer.values);
  return out;
}

function mergeInto(target: Record<string, unknown>, source: Record<string, unknown>) {
  for (const [key, value] of Object.entries(source)) {
    const existing = target[key];
    if (isPlainObject(value) && isPlainObject(existing)) mergeInto(existing, value);
    else target[key] = isPlainObject(value) ? mergeInto({}, value) : value;
  }
  return target;
}

/**
 * Where the effective value at `path` came from: the highest layer that sets it (or sets
 * an ancestor to a non-mapping), reported at the nearest recorded key. Undefined = default.
 */
export function originOf(layers: readonly Layer[], path: readonly string[]): Origin | undefined {
  for (let i = layers.length - 1; i >= 0; i--) {
    const layer = layers[i] as Layer;
    for (let n = path.length; n > 0; n--) {
      const prefix = path.slice(0, n);
      const v = getPath(layer.values, prefix);
      if (v === undefined) continue;
      if (n < path.length && isPlainObject(v)) break;
      const dotted = path.join(".");
      const own = layer.origins.get(dotted);
      if (own) return own;
      // A mapping set through its children (an override a.b.c=1 sets a.b) is at its first child.
      for (const [key, origin] of layer.origins) if (key.startsWith(`${dotted}.`)) return origin;
      for (let m = n; m > 0; m--) {
        const origin = layer.origins.get(path.slice(0, m).join("."));
        if (origin) return origin;
      }
      break;
    }
  }
  return undefined;
}
