import { readFile, rename, stat, writeFile } from "node:fs/promises";
import path from "node:path";

/** A file whose content was verified against the hub's hash. */
interface FileRecord {
  digest: string;
  size: number;
  mtimeMs: number;
}

/** A file or folder made from downloads (joined, expanded, extracted). */
interface OutputRecord {
  /** Digests of the downloads it was made from, in order. */
  from: string[];
  /** Size of a joined or expanded file. */
  size?: number;
  /** For an extracted archive (the key): its top-level entries, relative to its folder. */
  entries?: string[];
}

interface ManifestData {
  version: 1;
  files: Record<string, FileRecord>;
  outputs: Record<string, OutputRecord>;
}

export const MANIFEST_NAME = ".searchr1-download.json";

/**
 * What earlier runs verified and produced in a save folder, so that a re-run skips it without
 * hashing tens of gigabytes again. A file that changed since (size or mtime) is checked anew.
 */
export class Manifest {
  private constructor(
    private readonly dir: string,
    private readonly data: ManifestData,
  ) {}

  static async load(dir: string): Promise<Manifest> {
    const empty: ManifestData = { version: 1, files: {}, outputs: {} };
    try {
      const parsed = JSON.parse(await readFile(path.join(dir, MANIFEST_NAME), "utf8"));
      if (parsed?.version === 1) return new Manifest(dir, { ...empty, ...parsed });
    } catch {
      // Missing or unreadable: everything on disk gets verified again, which is safe.
    }
    return new Manifest(dir, empty);
  }

  async isVerified(rel: string, digest: string, size: number): Promise<boolean> {
    const rec = this.data.files[rel];
    if (!rec || rec.digest !== digest || rec.size !== size) return false;
    const s = await stat(path.join(this.dir, rel)).catch(() => undefined);
    return s?.isFile() === true && s.size === size && s.mtimeMs === rec.mtimeMs;
  }

  async recordFile(rel: string, digest: string): Promise<void> {
    const s = await stat(path.join(this.dir, rel));
    this.data.files[rel] = { digest, size: s.size, mtimeMs: s.mtimeMs };
    await this.save();
  }

  async forgetFile(rel: string): Promise<void> {
    delete this.data.files[rel];
    await this.save();
  }

  async isProduced(rel: string, from: string[]): Promise<boolean> {
    const rec = this.data.outputs[rel];
    if (!rec || rec.from.join(",") !== from.join(",")) return false;
    if (rec.entries) {
      const folder = path.dirname(path.join(this.dir, rel));
      const found = await Promise.all(
        rec.entries.map((e) =>
          stat(path.join(folder, e)).then(
            () => true,
            () => false,
          ),
        ),
      );
      return found.every(Boolean);
    }
    const s = await stat(path.join(this.dir, rel)).catch(() => undefined);
    return s?.isFile() === true && s.size === rec.size;
  }

  async recordOutput(rel: string, from: string[]): Promise<void> {
    const s = await stat(path.join(this.dir, rel));
    this.data.outputs[rel] = { from, size: s.size };
    await this.save();
  }

  /** Marks an archive (`rel`) as extracted into these top-level entries beside it. */
  async recordExtraction(rel: string, from: string[], entries: string[]): Promise<void> {
    this.data.outputs[rel] = { from, entries };
    await this.save();
  }

  private saving: Promise<void> = Promise.resolve();

  /** Files finish concurrently; saves go one after another so none clobbers another's temp file. */
  private save(): Promise<void> {
    const target = path.join(this.dir, MANIFEST_NAME);
    const write = async () => {
      await writeFile(`${target}.tmp`, `${JSON.stringify(this.data, null, 1)}\n`);
      await rename(`${target}.tmp`, target);
    };
    this.saving = this.saving.then(write, write);
    return this.saving;
  }
}
