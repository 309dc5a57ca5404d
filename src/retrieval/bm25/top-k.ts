import type { Hit } from "../retriever.js";

/** Whether hit (sa, ra) ranks below (sb, rb): lower score, or the same score and a later row. */
function worse(sa: number, ra: number, sb: number, rb: number): boolean {
  return sa < sb || (sa === sb && ra > rb);
}

/** The k best hits seen so far: a heap with the worst of them on top. */
export class TopK {
  private readonly rows: Int32Array;
  private readonly scores: Float64Array;
  private size = 0;
  /** Score a hit must beat to enter (−1 while there is room: BM25 scores are positive). */
  threshold: number;

  constructor(private readonly k: number) {
    this.rows = new Int32Array(k);
    this.scores = new Float64Array(k);
    this.threshold = k === 0 ? Infinity : -1;
  }

  /** Adds the hit if it ranks among the k best; returns whether it did. */
  offer(row: number, score: number): boolean {
    const { rows, scores } = this;
    if (this.size < this.k) {
      let at = this.size++;
      while (at > 0) {
        const parent = (at - 1) >> 1;
        if (!worse(score, row, scores[parent] as number, rows[parent] as number)) break;
        rows[at] = rows[parent] as number;
        scores[at] = scores[parent] as number;
        at = parent;
      }
      rows[at] = row;
      scores[at] = score;
    } else {
      if (this.k === 0 || !worse(scores[0] as number, rows[0] as number, score, row)) return false;
      let at = 0;
      for (;;) {
        const l = 2 * at + 1;
        if (l >= this.size) break;
        const r = l + 1;
        const m =
          r < this.size &&
          worse(scores[r] as number, rows[r] as number, scores[l] as number, rows[l] as number)
            ? r
            : l;
        if (!worse(scores[m] as number, rows[m] as number, score, row)) break;
        rows[at] = rows[m] as number;
        scores[at] = scores[m] as number;
        at = m;
      }
      rows[at] = row;
      scores[at] = score;
    }
    if (this.size === this.k) this.threshold = scores[0] as number;
    return true;
  }

  /** Best first; ties by ascending row. */
  hits(): Hit[] {
    const out: Hit[] = [];
    for (let i = 0; i < this.size; i++) {
      out.push({ row: this.rows[i] as number, score: this.scores[i] as number });
    }
    return out.sort((a, b) => b.score - a.score || a.row - b.row);
  }
}
