import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Tokenizer } from "tokenizers";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Detokenizer, firstStop, StopChecker } from "../../src/engine/detokenizer.js";
import { fixture, modelDir } from "./helpers.js";
import {
  byteLevelTokenizer,
  type MadeTokenizer,
  sentencePieceTokenizer,
  writeTokenizer,
} from "./tokenizers.js";

/**
 * Decoding and stop strings on hand-made tokenizers of the two decoder families (byte-level
 * BPE and SentencePiece-style). The reference is the tokenizers library decoding the whole
 * sequence at once, which is what Python's `tokenizer.decode(ids)` gives.
 */

interface Loaded {
  made: MadeTokenizer;
  detok: Detokenizer;
  ref: Tokenizer;
  /** Ids of tokens named as in MadeTokenizer.ids. */
  ids: (...names: string[]) => number[];
}

let dir: string;
let byte: Loaded;
let sp: Loaded;

function load(name: string, made: MadeTokenizer): Loaded {
  const folder = writeTokenizer(join(dir, name), made);
  return {
    made,
    detok: Detokenizer.load(folder),
    ref: Tokenizer.fromFile(join(folder, "tokenizer.json")),
    ids: (...names) =>
      names.map((n) => {
        const id = made.ids.get(n);
        if (id === undefined) throw new Error(`no token ${n}`);
        return id;
      }),
  };
}

const bytes = (s: string | number[]) =>
  [...(typeof s === "string" ? Buffer.from(s, "utf8") : s)].map((b) => `byte:${b}`);

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "sr1-detok-"));
  byte = load("byte", byteLevelTokenizer());
  sp = load("sp", sentencePieceTokenizer());
});

afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Pushes ids one by one; the token number (1-based) of the first stop match, and it. */
async function firstMatch(t: Loaded, ids: number[], stops: string[], skip = true) {
  const checker = new StopChecker(t.detok, stops, skip);
  for (let k = 0; k < ids.length; k++) {
    const m = await checker.push(ids[k] as number);
    if (m) return { token: k + 1, ...m };
  }
  return null;
}

describe("Detokenizer", () => {
  it("says which file is missing and how to serve without it", () => {
    expect(() => Detokenizer.load(join(dir, "nowhere"))).toThrow(
      /nowhere\/tokenizer\.json: no such file.*--skip-tokenizer-init/,
    );
  });

  it.each(["byte", "sp"] as const)(
    "%s: decodes as the library does, many calls at once, special tokens skipped or kept",
    async (which) => {
      const t = which === "byte" ? byte : sp;
      const seqs =
        which === "byte"
          ? [
              t.ids(" hello", " world", "<|im_end|>"),
              t.ids(...bytes("Zürich 中文"), "<|endoftext|>"),
              t.ids("</", "answer", ">", " é", "中"),
              t.ids(...bytes([0xe4, 0xb8])),
            ]
          : [
              t.ids("▁hello", "▁world", "</s>"),
              t.ids("<s>", "▁", ...bytes("Zürich 中文")),
              t.ids("▁</", "answer", ">", "▁é", "中"),
              t.ids("▁world", ...bytes([0xe4, 0xb8])),
            ];
      const calls = seqs.flatMap((ids) => [true, false].map((skip) => ({ ids, skip })));
      const got = await Promise.all(calls.map((c) => t.detok.decode(c.ids, c.skip)));
      const want = await Promise.all(calls.map((c) => t.ref.decode(c.ids, c.skip)));
      expect(got).toEqual(want);
      expect(want.some((w) => w.includes("中"))).toBe(true);
    },
  );
});

describe("StopChecker: the text token by token, and the first stop string", () => {
  it.each(["byte", "sp"] as const)(
    "%s: the text after each token is the library's decode of the tokens so far",
    async (which) => {
      const t = which === "byte" ? byte : sp;
      const ids =
        which === "byte"
          ? t.ids(
              " hello",
              ...bytes(" 中"),
              " world",
              "</",
              "answer",
              ">",
              " é",
              "中",
              ...bytes("ü!"),
            )
          : t.ids(
              "▁hello",
              "▁",
              ...bytes("中"),
              "▁world",
              "▁</",
              "answer",
              ">",
              "▁é",
              ...bytes("ü!"),
            );
      const checker = new StopChecker(t.detok, ["never-appears"], true);
      for (let k = 1; k <= ids.length; k++) {
        expect(await checker.push(ids[k - 1] as number)).toBeNull();
        const whole = await t.ref.decode(ids.slice(0, k), true);
        // A token that ends inside a character is held back until the character is whole.
        if (!whole.endsWith("\uFFFD")) expect(checker.decoded).toBe(whole);
        else expect(whole.startsWith(checker.decoded)).toBe(true);
      }
      expect(checker.decoded).toBe(
        which === "byte" ? " hello 中 world</answer> é中ü!" : "hello 中 world </answer> éü!",
      );
    },
  );

  it("byte-level: a stop string across token boundaries ends at the token that completes it", async () => {
    const ids = byte.ids(" hello", " world", " hello");
    expect(await firstMatch(byte, ids, ["o w"])).toMatchObject({
      token: 2,
      stop: "o w",
      before: " hell",
    });
    expect(await firstMatch(byte, ids, ["</answer>"])).toBeNull();
    const answer = byte.ids("</", "answer", ">", " hello");
    expect(await firstMatch(byte, answer, ["</answer>"])).toMatchObject({ token: 3, before: "" });
  });

  it("SentencePiece: the first space is stripped in the text, not in the middle", async () => {
    const ids = sp.ids("▁hello", "▁world", "▁</", "answer", ">");
    expect(await firstMatch(sp, ids, ["o w"])).toMatchObject({ token: 2, before: "hell" });
    expect(await firstMatch(sp, ids, [" </answer>"])).toMatchObject({
      token: 5,
      before: "hello world",
    });
    expect(await firstMatch(sp, ids, ["rld </"])).toMatchObject({ token: 3 });
  });

  it.each(["byte", "sp"] as const)(
    "%s: a multi-byte character split over tokens matches when its last byte comes",
    async (which) => {
      const t = which === "byte" ? byte : sp;
      const ids = t.ids(...bytes("a中b"));
      expect(ids).toHaveLength(5);
      expect(await firstMatch(t, ids, ["中"])).toMatchObject({ token: 4, before: "a" });
      expect(await firstMatch(t, ids, ["a中b"])).toMatchObject({ token: 5 });
    },
  );

  it("byte-level: text before an unfinished character is checked at once", async () => {
    // "</" "a" "n" "s" "w" "er>\xC3" "\xA9": the stop ends inside token 6, whose last byte
    // starts "é"; the request must stop at token 6, not wait for the character.
    const ids = byte.ids("</", ...bytes("answ"), "er>\\xC3", "byte:169");
    expect(await byte.ref.decode(ids, true)).toBe("</answer>é");
    expect(await firstMatch(byte, ids, ["</answer>"])).toMatchObject({ token: 6, before: "" });
    expect(await firstMatch(byte, ids, [">é"])).toMatchObject({ token: 7 });
  });

  it("special tokens count as text only with skip_special_tokens false", async () => {
    const ids = byte.ids(" hello", "<|im_end|>", " world");
    expect(await firstMatch(byte, ids, ["<|im_end|>"], false)).toMatchObject({ token: 2 });
    expect(await firstMatch(byte, ids, ["<|im_end|>"], true)).toBeNull();
    expect(await firstMatch(byte, ids, ["hello world"], true)).toMatchObject({ token: 3 });
  });

  it("firstStop: the earliest occurrence wins, then the one listed first", () => {
    expect(firstStop("abcdef", ["de", "bc"])).toEqual({ stop: "bc", index: 1 });
    expect(firstStop("abcdef", ["bcd", "bc"])).toEqual({ stop: "bcd", index: 1 });
    expect(firstStop("abcdef", ["bc"], 2)).toBeNull();
    expect(firstStop("abc", ["x"])).toBeNull();
  });
});

interface DecodeFixture {
  decode: { name: string; ids: number[]; text_skip_special: string; text_keep_special: string }[];
  /** text_*[k] = decode(ids[:k + 1]): the text after each token. */
  incremental: { ids: number[]; text_skip_special: string[]; text_keep_special: string[] };
}

describe.each(["qwen-bpe", "llama-sp"] as const)(
  "%s tokenizer.json: decoding equals the Python reference (decode.json)",
  (model) => {
    const ref = fixture<Record<string, DecodeFixture>>("decode.json")[model] as DecodeFixture;
    let detok: Detokenizer;
    beforeAll(() => {
      detok = Detokenizer.load(modelDir(model));
    });

    it.each(ref.decode.map((c) => [c.name, c]))("%s", async (_, c) => {
      expect(await detok.decode(c.ids, true)).toBe(c.text_skip_special);
      expect(await detok.decode(c.ids, false)).toBe(c.text_keep_special);
    });

    it.each([true, false])(
      "token by token (skip_special_tokens %s), multi-byte characters across tokens",
      async (skip) => {
        const { ids } = ref.incremental;
        const texts = skip ? ref.incremental.text_skip_special : ref.incremental.text_keep_special;
        expect(texts).toHaveLength(ids.length);
        const textAfter = (k: number) => (k === 0 ? "" : (texts[k - 1] as string));
        expect(texts.some((t) => t.endsWith("\uFFFD"))).toBe(true);
        const checker = new StopChecker(detok, ["\u0000never"], skip);
        for (let k = 1; k <= ids.length; k++) {
          expect(await checker.push(ids[k - 1] as number)).toBeNull();
          const whole = textAfter(k);
          if (!whole.endsWith("\uFFFD")) expect(checker.decoded).toBe(whole);
          else {
            // Unfinished character: what is shown is a prefix of the next whole text. (With
            // byte fallback, an unfinished character turns the whole run of byte tokens
            // before it into U+FFFD: "中" then the first byte of "文" decodes as "????".)
            const next = texts.slice(k).find((t) => !t.endsWith("\uFFFD")) ?? "";
            expect(next.startsWith(checker.decoded)).toBe(true);
          }
        }
        // Each prefix's new tail, as a stop string, is found at the token that completes it.
        for (let k = 1; k <= ids.length; k++) {
          const text = textAfter(k).replace(/\uFFFD+$/, "");
          const tail = text.slice(-2);
          const earlier = textAfter(k - 1).replace(/\uFFFD+$/, "");
          if (tail.length < 2 || tail.includes("\uFFFD") || earlier.includes(tail)) continue;
          const checker2 = new StopChecker(detok, [tail], skip);
          let at = -1;
          for (let j = 1; j <= k && at < 0; j++) {
            if (await checker2.push(ids[j - 1] as number)) at = j;
          }
          expect(at, `stop ${JSON.stringify(tail)} ends at token ${k}`).toBe(k);
        }
      },
    );
  },
);
