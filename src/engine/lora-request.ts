/**
 * The bodies of SGLang's `POST /load_lora_adapter` and `POST /unload_lora_adapter`
 * (python/sglang/srt/managers/io_struct.py: LoadLoRAAdapterReqInput {lora_name, lora_path,
 * pinned, lora_id}, UnloadLoRAAdapterReqInput {lora_name, lora_id}), checked field by field:
 * a problem is an HttpError 400 naming the field. The engine checks the adapter's files
 * against the model (native/src/engine/PROTOCOL.md, "LoRA").
 */
import { existsSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import { HttpError, typeOf } from "../runtime/http-server.js";

const bad = (message: string) => new HttpError(400, message);

function object(body: unknown, example: string, known: readonly string[]) {
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    throw bad(`request body must be a JSON object like ${example}, got ${typeOf(body)}`);
  }
  const b = body as Record<string, unknown>;
  for (const key of Object.keys(b)) {
    if (!known.includes(key)) {
      throw bad(`"${key}" is not a known key; known keys: ${known.join(", ")}`);
    }
  }
  // SGLang's tokenizer manager makes the id itself; a client's would not be used.
  if (b.lora_id !== undefined && b.lora_id !== null) {
    throw bad(`"lora_id" is set by the server (SGLang's too): leave it out or null`);
  }
  const name = b.lora_name;
  if (typeof name !== "string" || name === "") {
    throw bad(`"lora_name" is required: the adapter's name, got ${typeOf(name)}`);
  }
  return { b, name };
}

/** `{lora_name, lora_path}`: lora_path a PEFT adapter folder on the server. */
export function parseLoadLoraRequest(body: unknown): { name: string; path: string } {
  const { b, name } = object(body, `{"lora_name": "a", "lora_path": "/path/to/adapter"}`, [
    "lora_name",
    "lora_path",
    "pinned",
    "lora_id",
  ]);
  // Every adapter stays loaded until it is unloaded (none is evicted): pinned either way.
  if (b.pinned !== undefined && b.pinned !== null && typeof b.pinned !== "boolean") {
    throw bad(`"pinned" must be true or false, got ${typeOf(b.pinned)}`);
  }
  if (typeof b.lora_path !== "string" || b.lora_path === "") {
    throw bad(
      `"lora_path" is required: the PEFT adapter folder to load, got ${typeOf(b.lora_path)}`,
    );
  }
  const path = resolve(b.lora_path);
  if (!existsSync(path) || !statSync(path).isDirectory()) {
    throw bad(`"lora_path": ${path} is not a folder on the server`);
  }
  for (const file of ["adapter_config.json", "adapter_model.safetensors"]) {
    if (!existsSync(join(path, file))) {
      throw bad(`"lora_path": ${path} has no ${file} (not a PEFT adapter folder in safetensors)`);
    }
  }
  return { name, path };
}

/** `{lora_name}`. */
export function parseUnloadLoraRequest(body: unknown): { name: string } {
  return { name: object(body, `{"lora_name": "a"}`, ["lora_name", "lora_id"]).name };
}
