/** Hand-made torch.save files for tests: a stored zip like torch's and pickle opcodes. */
import { writeFileSync } from "node:fs";

export function writeZip(path: string, entries: Record<string, Buffer>): void {
  const chunks: Buffer[] = [];
  const central: Buffer[] = [];
  let offset = 0;
  for (const [name, data] of Object.entries(entries)) {
    const n = Buffer.from(name);
    const local = Buffer.alloc(30);
    local.writeUInt32LE(0x04034b50, 0);
    local.writeUInt16LE(20, 4);
    local.writeUInt32LE(data.length, 18);
    local.writeUInt32LE(data.length, 22);
    local.writeUInt16LE(n.length, 26);
    const dir = Buffer.alloc(46);
    dir.writeUInt32LE(0x02014b50, 0);
    dir.writeUInt16LE(20, 4);
    dir.writeUInt16LE(20, 6);
    dir.writeUInt32LE(data.length, 20);
    dir.writeUInt32LE(data.length, 24);
    dir.writeUInt16LE(n.length, 28);
    dir.writeUInt32LE(offset, 42);
    chunks.push(local, n, data);
    central.push(dir, n);
    offset += 30 + n.length + data.length;
  }
  const dirBytes = Buffer.concat(central);
  const end = Buffer.alloc(22);
  end.writeUInt32LE(0x06054b50, 0);
  end.writeUInt16LE(Object.keys(entries).length, 8);
  end.writeUInt16LE(Object.keys(entries).length, 10);
  end.writeUInt32LE(dirBytes.length, 12);
  end.writeUInt32LE(offset, 16);
  writeFileSync(path, Buffer.concat([...chunks, dirBytes, end]));
}

/** A protocol-2 pickle from its opcodes, with a PROTO header and STOP appended. */
export function pickleBytes(...parts: (string | Buffer)[]): Buffer {
  return Buffer.concat([
    Buffer.from([0x80, 0x02]),
    ...parts.map((p) => (typeof p === "string" ? Buffer.from(p, "latin1") : p)),
    Buffer.from("."),
  ]);
}

export const str = (s: string) => {
  const b = Buffer.from(s, "utf8");
  const len = Buffer.alloc(4);
  len.writeUInt32LE(b.length);
  return Buffer.concat([Buffer.from("X"), len, b]);
};
export const int = (n: number) => Buffer.from([0x4b, n]); // BININT1
export const tuple = (...items: Buffer[]) =>
  Buffer.concat([Buffer.from("("), ...items, Buffer.from("t")]);

/** `_rebuild_tensor_v2(storage key, offset, size, stride)` over a FloatStorage of `numel`. */
export function tensorOps(
  key: string,
  numel: number,
  offset: number,
  size: number[],
  stride: number[],
) {
  return Buffer.concat([
    Buffer.from("ctorch._utils\n_rebuild_tensor_v2\n"),
    tuple(
      tuple(
        str("storage"),
        Buffer.from("ctorch\nFloatStorage\n"),
        str(key),
        str("cpu"),
        int(numel),
      ),
      Buffer.from("Q"),
      int(offset),
      tuple(...size.map(int)),
      tuple(...stride.map(int)),
      Buffer.from([0x89]),
      Buffer.from("ccollections\nOrderedDict\n)R"),
    ),
    Buffer.from("R"),
  ]);
}

/** A torch.save-style zip: `archive/data.pkl`, `archive/data/<key>` storages, `archive/version`. */
export function writeTorchFile(
  path: string,
  pkl: Buffer,
  storages: Record<string, Buffer> = {},
): string {
  const entries: Record<string, Buffer> = { "archive/data.pkl": pkl };
  for (const [k, v] of Object.entries(storages)) entries[`archive/data/${k}`] = v;
  entries["archive/version"] = Buffer.from("3\n");
  writeZip(path, entries);
  return path;
}
