/**
 * The tensors of a Hugging Face safetensors folder (`model.safetensors`, or the shards
 * listed by `model.safetensors.index.json`), read lazily: what `native-to-hf` converts,
 * since the native trainer already writes plain HF folders.
 */
import { existsSync, readFileSync } from "node:fs";
import { type FileHandle, open } from "node:fs/promises";
import { join } from "node:path";
import { InputError } from "../runtime/errors.js";
import { DTYPE_SIZE, readSafetensorsHeader } from "../tensors/safetensors.js";
import type { Conversion, SourceTensor } from "./source.js";

export async function hfFolderTensors(dir: string): Promise<Conversion> {
  const files = shardFiles(dir);
  const handles: FileHandle[] = [];
  const close = async () => {
    await Promise.all(handles.map((h) => h.close()));
  };
  try {
    const tensors: SourceTensor[] = [];
    const seen = new Map<string, string>();
    for (const file of files) {
      const header = await readSafetensorsHeader(file);
      const handle = await open(file, "r");
      handles.push(handle);
      for (const t of header.tensors) {
        const other = seen.get(t.name);
        if (other) throw new InputError(`${file}: tensor '${t.name}' is also in ${other}`);
        seen.set(t.name, file);
        const length = t.end - t.begin;
        const position = header.dataStart + t.begin;
        tensors.push({
          name: t.name,
          dtype: t.dtype,
          shape: t.shape,
          read: async () => {
            const out = Buffer.allocUnsafe(length);
            const { bytesRead } = await handle.read(out, 0, length, position);
            if (bytesRead !== length)
              throw new InputError(`${file}: truncated in tensor '${t.name}'`);
            return out;
          },
        });
        if (length !== t.shape.reduce((a, b) => a * b, 1) * DTYPE_SIZE[t.dtype]) {
          throw new InputError(`${file}: tensor '${t.name}' has the wrong number of bytes`);
        }
      }
    }
    return { tensors, close };
  } catch (e) {
    await close();
    throw e;
  }
}

function shardFiles(dir: string): string[] {
  const index = join(dir, "model.safetensors.index.json");
  if (existsSync(index)) {
    let map: unknown;
    try {
      map = (JSON.parse(readFileSync(index, "utf8")) as { weight_map?: unknown }).weight_map;
    } catch (e) {
      throw new InputError(`${index}: invalid JSON (${(e as Error).message})`);
    }
    if (!map || typeof map !== "object") throw new InputError(`${index}: no "weight_map" object`);
    return [...new Set(Object.values(map as Record<string, string>))]
      .sort()
      .map((f) => join(dir, f));
  }
  const single = join(dir, "model.safetensors");
  if (existsSync(single)) return [single];
  throw new InputError(`${dir}: no model.safetensors or model.safetensors.index.json`);
}
