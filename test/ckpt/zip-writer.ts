/** Writes a stored (uncompressed) zip like torch.save's, for tests that need hand-made checkpoints. */
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
