import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { castBytes } from "../../src/ckpt/cast.js";
import {
  type HfFolderOptions,
  parseShardSize,
  planShards,
  writeHfFolder,
} from "../../src/ckpt/hf-folder.js";
import type { SourceTensor } from "../../src/ckpt/source.js";
import { InputError, UsageError } from "../../src/runtime/errors.js";
import type { Progress } from "../../src/runtime/progress.js";
import {
  type DType,
  readSafetensors,
  readSafetensorsHeader,
  type Tensor,
} from "../../src/tensors/safetensors.js";

const HF = path.join(import.meta.dirname, "fixtures", "hf");
const dir = mkdtempSync(path.join(os.tmpdir(), "searchr1-hf-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let count = 0;
/** A fresh path under the test folder, not yet created. */
function fresh(name = "out"): string {
  return path.join(dir, `${name}-${count++}`);
}

function bytesOf(t: Tensor): Buffer {
  return Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
}

/** The tensors of a fixture model folder, shard by shard, as a reader would hand them over. */
async function sources(model: string): Promise<SourceTensor[]> {
  const folder = path.join(HF, model);
  const out: SourceTensor[] = [];
  for (const file of readdirSync(folder)
    .filter((f) => f.endsWith(".safetensors"))
    .sort()) {
    for (const [name, t] of await readSafetensors(path.join(folder, file))) {
      out.push({ name, dtype: t.dtype, shape: t.shape, read: async () => bytesOf(t) });
    }
  }
  return out;
}

function recorder(): { progress: Progress; events: string[] } {
  const events: string[] = [];
  const progress: Progress = {
    task(label, total, unit) {
      events.push(`task ${label} ${total} ${unit}`);
      return {
        update: (done) => events.push(`update ${done}`),
        finish: () => events.push("finish"),
      };
    },
    log: () => {},
  };
  return { progress, events };
}

async function write(over: Partial<HfFolderOptions>): Promise<{
  out: string;
  warnings: string[];
  events: string[];
  summary: Awaited<ReturnType<typeof writeHfFolder>>;
}> {
  const warnings: string[] = [];
  const { progress, events } = recorder();
  const out = over.out ?? fresh();
  const summary = await writeHfFolder({
    out,
    baseDir: path.join(HF, "untied"),
    tensors: await sources("untied"),
    dtype: "keep",
    maxShardBytes: 5e9,
    overwrite: false,
    progress,
    warn: (m) => warnings.push(m),
    ...over,
  });
  return { out, warnings, events, summary };
}

async function failure(over: Partial<HfFolderOptions>): Promise<unknown> {
  return write(over).then(
    () => "no error",
    (e: unknown) => e,
  );
}

/** Nothing of a write is left beside `out`: no partial or old folder. */
function leftovers(): string[] {
  return readdirSync(dir).filter((f) => f.includes(".partial-") || f.includes(".old-"));
}

const entry = (name: string, bytes: number) => ({ name, dtype: "U8" as DType, shape: [bytes] });

describe("parseShardSize", () => {
  it("reads transformers' units: decimal KB/MB/GB, binary KiB/MiB/GiB, plain bytes", () => {
    expect(parseShardSize("5GB")).toBe(5e9);
    expect(parseShardSize("500MB")).toBe(5e8);
    expect(parseShardSize("5GiB")).toBe(5 * 2 ** 30);
    expect(parseShardSize("100KB")).toBe(1e5);
    expect(parseShardSize("10KiB")).toBe(10240);
    expect(parseShardSize("3mib")).toBe(3 * 2 ** 20);
    expect(parseShardSize("5gb")).toBe(5e9);
    expect(parseShardSize(" 2 GB ")).toBe(2e9);
    expect(parseShardSize("12345")).toBe(12345);
  });

  it("rejects anything else as a usage error naming the option and the text", () => {
    for (const bad of ["", "GB", "1.5GB", "-1GB", "5TB", "5 G", "abc"]) {
      const err = (() => {
        try {
          return parseShardSize(bad, "--shard");
        } catch (e) {
          return e;
        }
      })();
      expect(err).toBeInstanceOf(UsageError);
      expect((err as Error).message).toBe(
        `--shard: expected a size such as 5GB, 500MB, 2GiB or a number of bytes; got ${JSON.stringify(bad)}`,
      );
    }
    expect(() => parseShardSize("0")).toThrow('--max-shard-size: "0" is not a usable size');
    expect(() => parseShardSize("99999999GiB")).toThrow("is not a usable size");
  });
});

describe("planShards", () => {
  const names = (shards: ReturnType<typeof planShards>) =>
    shards.map((s) => [s.file, s.tensors.map((t) => t.name)]);

  it("follows huggingface_hub's split_state_dict_into_shards, oversize tensors included", () => {
    // huggingface_hub's own test_multiple_shards: sizes 6, 10, 30, 2, 2 with a limit of 10.
    const tensors = [
      entry("l1", 6),
      entry("l2", 10),
      entry("l3", 30),
      entry("l4", 2),
      entry("l5", 2),
    ];
    expect(names(planShards(tensors, 10))).toEqual([
      ["model-00001-of-00004.safetensors", ["l1"]],
      ["model-00002-of-00004.safetensors", ["l3"]],
      ["model-00003-of-00004.safetensors", ["l2"]],
      ["model-00004-of-00004.safetensors", ["l4", "l5"]],
    ]);
    expect(names(planShards(tensors, 50))).toEqual([
      ["model.safetensors", ["l1", "l2", "l3", "l4", "l5"]],
    ]);
  });

  it("fills a shard up to the limit exactly, counting bytes by dtype", () => {
    const f32 = (name: string, n: number) => ({ name, dtype: "F32" as DType, shape: [n, 2] });
    expect(names(planShards([f32("a", 1), f32("b", 1), f32("c", 1)], 16))).toEqual([
      ["model-00001-of-00002.safetensors", ["a", "b"]],
      ["model-00002-of-00002.safetensors", ["c"]],
    ]);
  });
});

describe("writeHfFolder", () => {
  it("writes one model.safetensors with format pt, the config and tokenizer files", async () => {
    const { out, summary, warnings, events } = await write({});
    const base = path.join(HF, "untied");
    const copied = readdirSync(base).filter((f) => !f.endsWith(".safetensors"));
    expect(readdirSync(out).sort()).toEqual([...copied, "model.safetensors"].sort());
    for (const f of copied) {
      expect(readFileSync(path.join(out, f)).equals(readFileSync(path.join(base, f))), f).toBe(
        true,
      );
    }
    const header = await readSafetensorsHeader(path.join(out, "model.safetensors"));
    expect(header.metadata).toEqual({ format: "pt" });
    const original = await readSafetensors(path.join(base, "model.safetensors"));
    const written = await readSafetensors(path.join(out, "model.safetensors"));
    expect([...written.keys()]).toEqual([...original.keys()]);
    for (const [name, t] of original) {
      expect(bytesOf(written.get(name) as Tensor).equals(bytesOf(t)), name).toBe(true);
    }
    const bytes = [...original.values()].reduce((s, t) => s + t.data.byteLength, 0);
    expect(summary).toEqual({
      files: ["model.safetensors"],
      tensors: original.size,
      bytes,
      dtypes: ["F32"],
      // F32 tensors and a float32 config: config.json is copied as it is.
      configDtype: [],
    });
    expect(warnings).toEqual([]);
    expect(events[0]).toBe(`task writing ${out} ${bytes} B`);
    expect(events.slice(-2)).toEqual([`update ${bytes}`, "finish"]);
    expect(events).toHaveLength(original.size + 2);
    expect(leftovers()).toEqual([]);
  });

  it("shards as transformers does: same split, files and index as hf/tied", async () => {
    const tied = path.join(HF, "tied");
    const { out, summary } = await write({
      baseDir: tied,
      tensors: await sources("tied"),
      maxShardBytes: parseShardSize("8736"),
    });
    const shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
    expect(summary.files).toEqual(shards);
    for (const f of [...shards, "model.safetensors.index.json"]) {
      expect(readFileSync(path.join(out, f)).equals(readFileSync(path.join(tied, f))), f).toBe(
        true,
      );
    }
  });

  it("writes the index as json.dumps(indent=2, sort_keys=True), total_size in tensor bytes", async () => {
    const tensor = (name: string, n: number, dtype: DType = "F32"): SourceTensor => ({
      name,
      dtype,
      shape: [n],
      read: async () => Buffer.alloc(n * 4),
    });
    const { out } = await write({
      tensors: [tensor("zeta", 4), tensor("alpha", 4), tensor("10", 2), tensor("é", 1)],
      dtype: "bf16",
      maxShardBytes: 16,
    });
    expect(readFileSync(path.join(out, "model.safetensors.index.json"), "utf8")).toBe(
      `{
  "metadata": {
    "total_size": 22
  },
  "weight_map": {
    "10": "model-00002-of-00002.safetensors",
    "alpha": "model-00001-of-00002.safetensors",
    "zeta": "model-00001-of-00002.safetensors",
    "\\u00e9": "model-00002-of-00002.safetensors"
  }
}
`,
    );
    const second = await readSafetensorsHeader(path.join(out, "model-00002-of-00002.safetensors"));
    expect(second.tensors.map((t) => [t.name, t.dtype])).toEqual([
      ["10", "BF16"],
      ["é", "BF16"],
    ]);
  });

  it("casts with --dtype, bit-exactly as the PyTorch fixtures, and sets config.json's torch_dtype to match", async () => {
    const { out, summary, warnings } = await write({ dtype: "bf16" });
    const want = await readSafetensors(
      path.join(import.meta.dirname, "fixtures", "cast", "untied-bf16.safetensors"),
    );
    const got = await readSafetensors(path.join(out, "model.safetensors"));
    for (const [name, t] of want) {
      expect(bytesOf(got.get(name) as Tensor).equals(bytesOf(t)), name).toBe(true);
    }
    expect(summary.dtypes).toEqual(["BF16"]);
    // untied says float32: the field is set to bfloat16, every other byte is the base's,
    // and nothing disagrees any more, so there is no warning.
    const baseConfig = readFileSync(path.join(HF, "untied", "config.json"), "utf8");
    expect(summary.configDtype).toEqual([
      { field: "torch_dtype", from: "float32", to: "bfloat16" },
    ]);
    expect(readFileSync(path.join(out, "config.json"), "utf8")).toBe(
      baseConfig.replace('"torch_dtype": "float32"', '"torch_dtype": "bfloat16"'),
    );
    expect(warnings).toEqual([]);

    // keepConfig copies config.json unchanged, and then warns that it disagrees.
    const kept = await write({ dtype: "bf16", keepConfig: true });
    expect(kept.summary.configDtype).toEqual([]);
    expect(readFileSync(path.join(kept.out, "config.json"), "utf8")).toBe(baseConfig);
    expect(kept.warnings).toEqual([
      `${kept.out}/config.json: tensors are BF16 but config.json says torch_dtype float32; transformers will load them as float32 (--keep-config); without --keep-config it is set to match`,
    ]);

    // tied says bfloat16: F16 changes it, BF16 leaves it (and its bytes) as they are.
    const tied = { baseDir: path.join(HF, "tied"), tensors: await sources("tied") };
    const tiedConfig = readFileSync(path.join(HF, "tied", "config.json"), "utf8");
    const fp16 = await write({ ...tied, dtype: "fp16" });
    expect(fp16.summary.configDtype).toEqual([
      { field: "torch_dtype", from: "bfloat16", to: "float16" },
    ]);
    expect(JSON.parse(readFileSync(path.join(fp16.out, "config.json"), "utf8")).torch_dtype).toBe(
      "float16",
    );
    expect(fp16.warnings).toEqual([]);
    const bf16 = await write({ ...tied, dtype: "bf16" });
    expect(bf16.summary.configDtype).toEqual([]);
    expect(readFileSync(path.join(bf16.out, "config.json"), "utf8")).toBe(tiedConfig);
    expect(bf16.warnings).toEqual([]);
  });

  it("leaves config.json alone and warns when the float tensors mix dtypes", async () => {
    const half = castBytes(Buffer.from(new Float32Array([1.5]).buffer), "F32", "F16");
    const single = Buffer.from(new Float32Array([2.5]).buffer);
    const { out, summary, warnings } = await write({
      tensors: [
        { name: "h", dtype: "F16", shape: [1], read: async () => half },
        { name: "s", dtype: "F32", shape: [1], read: async () => single },
      ],
    });
    expect(summary.dtypes).toEqual(["F16", "F32"]);
    // A mix has no single right value, so untied's float32 stays.
    expect(summary.configDtype).toEqual([]);
    expect(readFileSync(path.join(out, "config.json"))).toEqual(
      readFileSync(path.join(HF, "untied", "config.json")),
    );
    expect(warnings).toEqual([
      `${out}/config.json: tensors are F16, F32 but config.json says torch_dtype float32; pass --dtype fp32 to write them all as float32`,
    ]);
  });

  it("sets the newer `dtype` field of config.json, and reads it for the warning", async () => {
    const base = fresh("base");
    mkdirSync(base);
    writeFileSync(path.join(base, "config.json"), JSON.stringify({ dtype: "float16" }));
    const { out, summary, warnings } = await write({ baseDir: base, dtype: "fp32" });
    expect(summary.configDtype).toEqual([{ field: "dtype", from: "float16", to: "float32" }]);
    expect(readFileSync(path.join(out, "config.json"), "utf8")).toBe('{"dtype":"float32"}');
    expect(warnings).toEqual([]);

    const kept = await write({ baseDir: base, dtype: "fp32", keepConfig: true });
    expect(readFileSync(path.join(kept.out, "config.json"), "utf8")).toBe('{"dtype":"float16"}');
    expect(kept.warnings).toEqual([
      `${kept.out}/config.json: tensors are F32 but config.json says dtype float16; transformers will load them as float16 (--keep-config); without --keep-config it is set to match`,
    ]);
  });

  it("copies every regular non-weight file and skips weights and folders", async () => {
    const base = fresh("base");
    cpSync(path.join(HF, "untied"), base, { recursive: true });
    const weights = [
      "pytorch_model.bin",
      "pytorch_model.bin.index.json",
      "model.safetensors.index.json",
      "model-00001-of-00002.safetensors",
      "tf_model.h5",
      "flax_model.msgpack",
      "training_args.bin",
      "optim.pt",
      "old.pth",
      "last.ckpt",
    ];
    for (const f of [...weights, "chat_template.jinja", "README.md"]) {
      writeFileSync(path.join(base, f), f);
    }
    mkdirSync(path.join(base, "original"));
    writeFileSync(path.join(base, "original", "params.json"), "{}");
    const { out } = await write({ baseDir: base });
    const listing = readdirSync(out);
    expect(listing).toContain("chat_template.jinja");
    expect(listing).toContain("README.md");
    expect(listing).toContain("tokenizer.json");
    for (const f of [...weights, "original"]) expect(listing).not.toContain(f);
  });

  it("requires the base model's config.json", async () => {
    const base = fresh("base");
    mkdirSync(base);
    const out = fresh();
    const err = await failure({ baseDir: base, out });
    expect(err).toBeInstanceOf(InputError);
    expect((err as Error).message).toBe(
      `${path.join(base, "config.json")}: no such file (the base model's config)`,
    );
    expect(existsSync(out)).toBe(false);
  });

  it("refuses a non-empty --out without overwrite, and replaces it with overwrite", async () => {
    const out = fresh();
    mkdirSync(out);
    writeFileSync(path.join(out, "old.txt"), "old");
    const err = await failure({ out });
    expect(err).toBeInstanceOf(UsageError);
    expect((err as UsageError).exitCode).toBe(2);
    expect((err as Error).message).toBe(`${out}: already exists; pass --overwrite to replace it`);
    expect(readdirSync(out)).toEqual(["old.txt"]);
    expect(leftovers()).toEqual([]);

    await write({ out, overwrite: true });
    expect(readdirSync(out)).toContain("model.safetensors");
    expect(readdirSync(out)).not.toContain("old.txt");
    expect(leftovers()).toEqual([]);
  });

  it("fills an empty --out folder; a file there is an existing output like any other", async () => {
    const out = fresh();
    mkdirSync(out);
    await write({ out });
    expect(readdirSync(out)).toContain("model.safetensors");

    // Refused without overwrite (exit 2), and left as it was.
    const file = fresh();
    writeFileSync(file, "x");
    const err = await failure({ out: file });
    expect(err).toBeInstanceOf(UsageError);
    expect((err as UsageError).exitCode).toBe(2);
    expect((err as Error).message).toBe(`${file}: already exists; pass --overwrite to replace it`);
    expect(readFileSync(file, "utf8")).toBe("x");

    // With overwrite it is replaced by the finished folder, as every command does.
    await write({ out: file, overwrite: true });
    expect(readdirSync(file)).toContain("model.safetensors");
    expect(leftovers()).toEqual([]);
  });

  it("leaves nothing behind when aborted, and keeps an old folder untouched", async () => {
    const controller = new AbortController();
    const tensors = (await sources("untied")).map((t, i) => ({
      ...t,
      read: async () => {
        if (i === 3) controller.abort();
        return t.read();
      },
    }));
    const out = fresh();
    const err = await failure({ out, tensors, signal: controller.signal });
    expect((err as Error).name).toBe("AbortError");
    expect(existsSync(out)).toBe(false);
    expect(leftovers()).toEqual([]);

    const old = fresh();
    mkdirSync(old);
    writeFileSync(path.join(old, "keep.txt"), "keep");
    await failure({ out: old, overwrite: true, tensors, signal: controller.signal });
    expect(readdirSync(old)).toEqual(["keep.txt"]);
    expect(leftovers()).toEqual([]);
  });

  it("rejects a read() of the wrong length, naming the tensor, and leaves nothing", async () => {
    const tensors = await sources("untied");
    const bad = tensors[5] as SourceTensor;
    tensors[5] = { ...bad, read: async () => (await bad.read()).subarray(4) };
    const out = fresh();
    const err = await failure({ out, tensors, maxShardBytes: 20_000 });
    expect(err).toBeInstanceOf(InputError);
    const need = (await bad.read()).length;
    expect((err as Error).message).toBe(
      `tensor '${bad.name}': read ${need - 4} bytes, but F32 [${bad.shape.join(", ")}] takes ${need}`,
    );
    expect(existsSync(out)).toBe(false);
    expect(leftovers()).toEqual([]);
  });

  it("rejects duplicate tensor names and an empty checkpoint", async () => {
    const tensors = await sources("untied");
    const err = await failure({ tensors: [...tensors, tensors[2] as SourceTensor] });
    expect(err).toBeInstanceOf(InputError);
    expect((err as Error).message).toBe(
      `tensor '${tensors[2]?.name}' appears more than once in the checkpoint`,
    );
    await expect(write({ tensors: [] })).rejects.toThrow("the checkpoint has no tensors");
  });

  it("passes non-float tensors through --dtype unchanged", async () => {
    const ids = Buffer.from(new BigInt64Array([1n, -2n]).buffer);
    const half = castBytes(Buffer.from(new Float32Array([1.5]).buffer), "F32", "F16");
    const { out, summary } = await write({
      tensors: [
        { name: "ids", dtype: "I64", shape: [2], read: async () => ids },
        { name: "h", dtype: "F16", shape: [1], read: async () => half },
      ],
      dtype: "fp32",
    });
    const got = await readSafetensors(path.join(out, "model.safetensors"));
    expect(got.get("ids")?.data).toEqual(new BigInt64Array([1n, -2n]));
    expect(got.get("h")?.data).toEqual(new Float32Array([1.5]));
    expect(summary.dtypes).toEqual(["F32", "I64"]);
  });
});
