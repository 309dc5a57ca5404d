/**
 * The bytes each token id stands for, read from a model's `tokenizer.json`: what the native
 * engine's grammar masks (native/src/engine/token_mask.h) match tokens with. A token's text
 * may be part of a UTF-8 character, so bytes, not strings.
 *
 * Two kinds of vocabulary spell every byte, and are read here:
 * - byte-level BPE (GPT-2, Qwen2, Llama 3: the `ByteLevel` decoder): each character of a
 *   vocabulary entry stands for one byte through GPT-2's bytes_to_unicode table
 *   (openai/gpt-2 src/encoder.py; tokenizers' `ByteLevel` decoder is the same table);
 * - SentencePiece-style BPE with byte fallback (Llama 2, Mistral: a `Sequence` decoder of
 *   `Replace` ▁ → space and `ByteFallback`): `<0xAB>` is byte 0xAB, any other entry is its
 *   text with ▁ as a space. The decoder's `Strip` of the first space of a whole text is not
 *   a token's: the grammar sees that space, the decoded text loses it, as JSON allows.
 *
 * Added tokens are their content; special ones (EOS, chat markers) have no bytes: a grammar
 * never writes them (the engine lets the end tokens come where the grammar may end).
 */
import { readFileSync } from "node:fs";
import { InputError } from "../runtime/errors.js";

interface TokenizerJson {
  model?: { type?: string; vocab?: unknown };
  decoder?: { type?: string; decoders?: { type?: string; pattern?: { String?: string } }[] };
  added_tokens?: { id: number; content: string; special: boolean }[];
}

/** GPT-2's bytes_to_unicode, inverted: the character a byte-level vocabulary writes → byte. */
function byteLevelTable(): Map<string, number> {
  const printable = (b: number) =>
    (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const table = new Map<string, number>();
  let shifted = 0;
  for (let b = 0; b < 256; b++) {
    table.set(String.fromCodePoint(printable(b) ? b : 256 + shifted++), b);
  }
  return table;
}

type Kind = "byte-level" | "byte-fallback";

function kindOf(json: TokenizerJson, path: string): Kind {
  const decoder = json.decoder;
  if (decoder?.type === "ByteLevel") return "byte-level";
  const steps = decoder?.type === "Sequence" ? (decoder.decoders ?? []) : [];
  const has = (type: string) => steps.some((d) => d.type === type);
  if (has("ByteFallback") && steps.some((d) => d.type === "Replace" && d.pattern?.String === "▁")) {
    return "byte-fallback";
  }
  throw new InputError(
    `${path}: constrained decoding needs each token's bytes, read from a byte-level BPE ` +
      "(decoder ByteLevel) or a SentencePiece-style byte-fallback vocabulary; this tokenizer's " +
      `decoder is ${JSON.stringify(decoder?.type ?? null)}`,
  );
}

function entryBytes(entry: string, kind: Kind, table: Map<string, number>): Buffer | null {
  if (kind === "byte-fallback") {
    const byte = /^<0x([0-9A-Fa-f]{2})>$/.exec(entry);
    const hex = byte?.[1];
    return hex ? Buffer.from([Number.parseInt(hex, 16)]) : Buffer.from(entry.replaceAll("▁", " "));
  }
  const out: number[] = [];
  for (const ch of entry) {
    const b = table.get(ch);
    if (b === undefined) return null; // not a byte-level entry: never generated in a grammar
    out.push(b);
  }
  return Buffer.from(out);
}

/**
 * Each token id's bytes as lower-case hex (the engine's `token_bytes` command), "" for a
 * token a grammar never writes. An InputError naming the file when its vocabulary is not one
 * of the two kinds above.
 */
export function tokenBytesHex(path: string): string[] {
  let json: TokenizerJson;
  try {
    json = JSON.parse(readFileSync(path, "utf8")) as TokenizerJson;
  } catch (err) {
    throw new InputError(`${path}: not readable as JSON (${(err as Error).message})`);
  }
  const kind = kindOf(json, path);
  const vocab = json.model?.vocab;
  if (json.model?.type !== "BPE" || vocab === null || typeof vocab !== "object") {
    throw new InputError(
      `${path}: constrained decoding reads a BPE vocabulary (model.vocab, token → id); this ` +
        `tokenizer's model is ${JSON.stringify(json.model?.type ?? null)}`,
    );
  }
  const table = byteLevelTable();
  const out: string[] = [];
  const set = (id: number, bytes: Buffer | null) => {
    while (out.length <= id) out.push("");
    out[id] = bytes === null ? "" : bytes.toString("hex");
  };
  for (const [entry, id] of Object.entries(vocab as Record<string, number>)) {
    set(id, entryBytes(entry, kind, table));
  }
  for (const added of json.added_tokens ?? []) {
    set(added.id, added.special ? null : Buffer.from(added.content));
  }
  return out;
}
