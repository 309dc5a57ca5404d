import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { PyObject } from "../../src/ckpt/pickle.js";
import { loadTorchFile } from "../../src/ckpt/torch-load.js";
import { TorchTensor } from "../../src/ckpt/torch-tensor.js";
import { pickleBytes, str, tensorOps, writeTorchFile } from "./handmade.js";

const dir = mkdtempSync(join(tmpdir(), "searchr1-torchload-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const checkpoint = (name: string, pkl: Buffer, storages: Record<string, Buffer> = {}) =>
  writeTorchFile(join(dir, name), pkl, storages);
const floats = (...v: number[]) => Buffer.from(new Float32Array(v).buffer);

describe("loadTorchFile", () => {
  it("rebuilds views with storage offsets and strides, lazily, from a hand-made checkpoint", async () => {
    // A dict {"w": 2x2 view at offset 2 with stride (1, 2)}: a transposed slice.
    const pkl = pickleBytes("}", str("w"), tensorOps("0", 6, 2, [2, 2], [1, 2]), "s");
    const file = checkpoint("view.pt", pkl, { "0": floats(0, 1, 2, 3, 4, 5) });
    const { value, archive } = await loadTorchFile(file);
    const t = (value as Map<string, unknown>).get("w") as TorchTensor;
    expect(t).toBeInstanceOf(TorchTensor);
    expect([t.dtype, t.shape, t.stride, t.offset]).toEqual(["F32", [2, 2], [1, 2], 2]);
    const bytes = await t.read("w");
    expect(Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, 4))).toEqual([2, 4, 3, 5]);
    await archive.close();
  });

  it("turns unknown globals into inert records", async () => {
    const lr = Buffer.from([0x3f, 0xb9, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9a]); // 0.1, big-endian
    const pkl = pickleBytes("cargparse\nNamespace\n)\x81}", str("lr"), "G", lr, "sb");
    const { value, archive } = await loadTorchFile(checkpoint("ns.pt", pkl));
    expect(value).toBeInstanceOf(PyObject);
    const ns = value as PyObject;
    expect(ns.cls.qualified).toBe("argparse.Namespace");
    expect((ns.state as Map<string, number>).get("lr")).toBeCloseTo(0.1);
    await archive.close();
  });

  it("reads enum members pickled as getattr(EnumClass, name) as inert globals", async () => {
    const pkl = pickleBytes(
      "c__builtin__\ngetattr\ncmegatron.core.transformer.enums\nAttnBackend\n",
      str("auto"),
      "\x86R",
    );
    const { value, archive } = await loadTorchFile(checkpoint("enum.pt", pkl));
    expect(value).toMatchObject({
      module: "megatron.core.transformer.enums",
      name: "AttnBackend.auto",
    });
    await archive.close();
  });

  it("refuses os.system, eval and subprocess without running them", async () => {
    const marker = join(dir, "pwned");
    const cases = [
      ["posix", "system"],
      ["os", "system"],
      ["builtins", "eval"],
      ["subprocess", "Popen"],
    ];
    for (const [module, name] of cases) {
      const pkl = pickleBytes(`c${module}\n${name}\n`, str(`touch ${marker}`), "\x85R");
      const file = checkpoint(`${module}-${name}.pt`, pkl);
      await expect(loadTorchFile(file)).rejects.toThrow(`refusing global ${module}.${name}`);
    }
    expect(existsSync(marker)).toBe(false);
  });

  it("refuses unknown opcodes, truncated pickles and broken memo references with the byte offset", async () => {
    await expect(loadTorchFile(checkpoint("op.pt", pickleBytes("\xff")))).rejects.toThrow(
      "pickle byte 2: unknown opcode 0xff",
    );
    const truncated = pickleBytes(str("abc")).subarray(0, 6);
    await expect(loadTorchFile(checkpoint("trunc.pkl.pt", truncated))).rejects.toThrow("truncated");
    await expect(loadTorchFile(checkpoint("memo.pt", pickleBytes("h\x07")))).rejects.toThrow(
      "memo key 7 was never stored",
    );
    await expect(loadTorchFile(checkpoint("under.pt", pickleBytes("s")))).rejects.toThrow(
      "stack underflow",
    );
  });

  it("refuses a view that runs past its storage when the tensor is used", async () => {
    const pkl = pickleBytes(tensorOps("0", 4, 2, [2, 2], [2, 1]));
    const { value, archive } = await loadTorchFile(
      checkpoint("oob.pt", pkl, { "0": floats(0, 1, 2, 3) }),
    );
    await expect((value as TorchTensor).read("layer.w")).rejects.toThrow(
      "tensor 'layer.w': view [2, 2] at offset 2 runs past its storage (4 elements)",
    );
    await archive.close();
  });

  it("names unsupported storage types and missing storage records", async () => {
    const complex = pickleBytes(
      tensorOps("0", 1, 0, [1], [1])
        .toString("latin1")
        .replace("FloatStorage", "ComplexFloatStorage"),
    );
    const a = await loadTorchFile(checkpoint("complex.pt", complex, { "0": floats(0, 0) }));
    await expect((a.value as TorchTensor).read("z")).rejects.toThrow(
      "unsupported storage type torch.ComplexFloatStorage",
    );
    await a.archive.close();
    const b = await loadTorchFile(
      checkpoint("nostore.pt", pickleBytes(tensorOps("9", 1, 0, [1], [1]))),
    );
    await expect((b.value as TorchTensor).read("z")).rejects.toThrow("storage data/9 is missing");
    await b.archive.close();
  });

  it("refuses truncated and non-zip files", async () => {
    const good = checkpoint("good.pt", pickleBytes(tensorOps("0", 2, 0, [2], [1])), {
      "0": floats(1, 2),
    });
    const bytes = readFileSync(good);
    for (const cut of [bytes.length - 10, Math.floor(bytes.length / 2), 10]) {
      const path = join(dir, `cut-${cut}.pt`);
      writeFileSync(path, bytes.subarray(0, cut));
      await expect(loadTorchFile(path)).rejects.toThrow(
        /not a torch\.save zip checkpoint|truncated/,
      );
    }
    const legacy = join(dir, "legacy.pt");
    writeFileSync(legacy, Buffer.concat([Buffer.from([0x80, 0x02, 0x8a, 0x0a]), Buffer.alloc(40)]));
    await expect(loadTorchFile(legacy)).rejects.toThrow("legacy torch format is not supported");
  });
});
