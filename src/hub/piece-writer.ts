import type { Hash } from "node:crypto";
import type { FileHandle } from "node:fs/promises";

/** One range of a file fetched by one request (retried from where it stopped). */
export interface Piece {
  start: number;
  end: number;
  received: number;
  /** Bytes received but not yet on disk: this piece is ahead of the one being written. */
  pending: Buffer[];
  done: boolean;
}

export function splitPieces(start: number, end: number, pieceBytes: number): Piece[] {
  const pieces: Piece[] = [];
  for (let s = start; s < end; s += pieceBytes) {
    pieces.push({
      start: s,
      end: Math.min(end, s + pieceBytes),
      received: 0,
      pending: [],
      done: false,
    });
  }
  return pieces;
}

/**
 * Writes pieces that arrive in any order to the file in order, hashing as it writes. The file
 * therefore always holds a contiguous prefix (its size is where a later run resumes) and the
 * hash needs no second read. Pieces ahead of the head wait in memory; `admit` bounds how far.
 */
export class PieceWriter {
  private head = 0;
  private flushing: Promise<void> = Promise.resolve();
  private wakers: (() => void)[] = [];

  constructor(
    private readonly file: FileHandle,
    private readonly hash: Hash,
    private readonly pieces: Piece[],
    private position: number,
  ) {}

  /** Bytes on disk so far. */
  get written(): number {
    return this.position;
  }

  /** Takes bytes of piece i; waits for the disk only when i is the head, which paces its request. */
  add(i: number, chunk: Buffer): Promise<void> {
    const piece = this.pieces[i] as Piece;
    piece.pending.push(chunk);
    piece.received += chunk.length;
    const flushed = this.flush();
    return i === this.head ? flushed : Promise.resolve();
  }

  complete(i: number): Promise<void> {
    (this.pieces[i] as Piece).done = true;
    return this.flush();
  }

  /** Resolves when piece i is fewer than `window` pieces ahead of the one being written. */
  async admit(i: number, window: number, signal: AbortSignal): Promise<void> {
    while (i - this.head >= window) {
      signal.throwIfAborted();
      await new Promise<void>((resolve) => {
        const wake = () => {
          signal.removeEventListener("abort", wake);
          resolve();
        };
        this.wakers.push(wake);
        signal.addEventListener("abort", wake, { once: true });
      });
    }
    signal.throwIfAborted();
  }

  /** Writes whatever is contiguous now; rejects if a write failed. */
  flush(): Promise<void> {
    this.flushing = this.flushing.then(() => this.drain());
    // Callers that do not wait still must not leave a rejection unhandled; the final flush reports it.
    this.flushing.catch(() => {});
    return this.flushing;
  }

  private async drain(): Promise<void> {
    for (let piece = this.pieces[this.head]; piece; piece = this.pieces[this.head]) {
      // Everything waiting goes down in one writev: per-chunk writes cost a syscall each.
      while (piece.pending.length > 0) {
        const batch = piece.pending.splice(0);
        const { bytesWritten } = await this.file.writev(batch, this.position);
        const expected = batch.reduce((n, b) => n + b.length, 0);
        if (bytesWritten !== expected)
          throw new Error(`short write: ${bytesWritten} of ${expected} bytes`);
        for (const b of batch) this.hash.update(b);
        this.position += bytesWritten;
      }
      if (!piece.done) return;
      this.head++;
      for (const wake of this.wakers.splice(0)) wake();
    }
  }
}
