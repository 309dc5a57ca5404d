import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

/**
 * A private folder for the batch and output files of one trainer. It lives in /dev/shm
 * where there is one (the files are written once, read once by the other process and
 * deleted: memory is the right place for them), else in the system's temp folder. The
 * folder is made on first use and removed by `remove()`, or when Node exits, so a run
 * that stops early leaves nothing behind.
 */
export class ScratchDir {
  private dir: string | null = null;
  private count = 0;
  private readonly onExit = () => this.removeSync();

  constructor(
    /** Where the folder goes; default /dev/shm, else os.tmpdir(). */
    private readonly parent = existsSync("/dev/shm") ? "/dev/shm" : tmpdir(),
  ) {}

  /** The folder (made now if it is not there yet). */
  path(): string {
    if (this.dir === null) {
      this.dir = mkdtempSync(join(this.parent, "searchr1-trainer-"));
      process.once("exit", this.onExit);
    }
    return this.dir;
  }

  /** A fresh file name in the folder: `<n>-<stem>.safetensors`. */
  file(stem: string): string {
    return join(this.path(), `${++this.count}-${stem}.safetensors`);
  }

  /** Removes the folder and everything in it; a later `file()` makes a new one. */
  async remove(): Promise<void> {
    const dir = this.dir;
    if (dir === null) return;
    this.dir = null;
    process.off("exit", this.onExit);
    await rm(dir, { recursive: true, force: true });
  }

  private removeSync(): void {
    if (this.dir !== null) rmSync(this.dir, { recursive: true, force: true });
    this.dir = null;
  }
}
