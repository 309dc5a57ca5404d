/**
 * A tensor inside a torch.save checkpoint, not yet read: its dtype, shape, strides and
 * storage offset as pickled, and where its storage lies in the zip. `read()` returns the
 * values as contiguous row-major bytes, gathering views and non-contiguous layouts.
 */
import { InputError } from "../runtime/errors.js";
import { DTYPE_SIZE, type DType } from "../tensors/safetensors.js";
import type { ZipArchive, ZipEntry } from "./zip.js";

/** One storage record of the checkpoint (`data/<key>` in the zip). */
export interface TorchStorage {
  key: string;
  /** Undefined for a storage type this reader does not support; `typeName` says which. */
  dtype: DType | undefined;
  typeName: string;
  archive: ZipArchive;
  entry: ZipEntry | undefined;
}

export class TorchTensor {
  constructor(
    readonly storage: TorchStorage,
    readonly dtype: DType | undefined,
    /** In elements. */
    readonly offset: number,
    readonly shape: number[],
    readonly stride: number[],
  ) {}

  get numel(): number {
    return this.shape.reduce((a, b) => a * b, 1);
  }

  /** Checks what `read()` relies on; `name` is how errors refer to this tensor. */
  validate(name: string): DType {
    const where = `${this.storage.archive.path}: tensor '${name}'`;
    const { dtype, storage } = this;
    if (!dtype || !storage.dtype) {
      throw new InputError(`${where}: unsupported storage type ${storage.typeName}`);
    }
    if (!storage.entry) throw new InputError(`${where}: storage data/${storage.key} is missing`);
    const size = DTYPE_SIZE[dtype];
    if (storage.entry.size % size !== 0) {
      throw new InputError(
        `${where}: storage data/${storage.key} is not a whole number of ${dtype}`,
      );
    }
    if (this.numel > 0) {
      const last = this.shape.reduce(
        (a, d, i) => a + (d - 1) * (this.stride[i] as number),
        this.offset,
      );
      if (last >= storage.entry.size / size) {
        throw new InputError(
          `${where}: view [${this.shape.join(", ")}] at offset ${this.offset} runs past its storage ` +
            `(${storage.entry.size / size} elements)`,
        );
      }
    }
    return dtype;
  }

  get contiguous(): boolean {
    let expected = 1;
    for (let i = this.shape.length - 1; i >= 0; i--) {
      const d = this.shape[i] as number;
      if (d !== 1 && this.stride[i] !== expected) return false;
      expected *= d;
    }
    return true;
  }

  async read(name: string): Promise<Buffer> {
    const dtype = this.validate(name);
    const size = DTYPE_SIZE[dtype];
    const entry = this.storage.entry as ZipEntry;
    const archive = this.storage.archive;
    const n = this.numel;
    if (n === 0) return Buffer.alloc(0);
    if (this.contiguous) return archive.read(entry, this.offset * size, n * size);
    // Read the span the view covers once, then gather rows (runs along the last dim).
    const span = this.shape.reduce((a, d, i) => a + (d - 1) * (this.stride[i] as number), 0) + 1;
    const src = await archive.read(entry, this.offset * size, span * size);
    return gather(src, this.shape, this.stride, size);
  }
}

function gather(src: Buffer, shape: number[], stride: number[], size: number): Buffer {
  const rank = shape.length;
  const out = Buffer.allocUnsafe(shape.reduce((a, b) => a * b, 1) * size);
  const inner = shape[rank - 1] as number;
  const innerStride = stride[rank - 1] as number;
  const index = new Array<number>(Math.max(rank - 1, 0)).fill(0);
  let o = 0;
  for (;;) {
    let base = 0;
    for (let i = 0; i < rank - 1; i++) base += (index[i] as number) * (stride[i] as number);
    if (innerStride === 1) {
      src.copy(out, o, base * size, (base + inner) * size);
      o += inner * size;
    } else {
      for (let j = 0; j < inner; j++) {
        const from = (base + j * innerStride) * size;
        src.copy(out, o, from, from + size);
        o += size;
      }
    }
    let k = rank - 2;
    while (k >= 0) {
      index[k] = (index[k] as number) + 1;
      if ((index[k] as number) < (shape[k] as number)) break;
      index[k] = 0;
      k--;
    }
    if (k < 0) return out;
  }
}
