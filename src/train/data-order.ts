import { Rng } from "../runtime/rng.js";

/**
 * Which prompts each training step gets: epoch e visits the items in a shuffle seeded by
 * (seed, e), cut into batches of `batchSize` with the tail dropped (verl's loader:
 * shuffle=True, drop_last=True). Step s (1-based) is a pure function of (seed, s), so a
 * resumed run sees exactly the prompts an uninterrupted run would.
 */
export class DataOrder<T> {
  readonly batchesPerEpoch: number;

  constructor(
    private readonly items: readonly T[],
    private readonly batchSize: number,
    private readonly seed: number,
    private readonly shuffle: boolean,
  ) {
    this.batchesPerEpoch = Math.floor(items.length / batchSize);
  }

  /** The epoch (0-based) and the prompts of step `step` (1-based). */
  batch(step: number): { epoch: number; items: T[] } {
    const epoch = Math.floor((step - 1) / this.batchesPerEpoch);
    const within = (step - 1) % this.batchesPerEpoch;
    const order = this.order(epoch);
    return {
      epoch,
      items: order
        .slice(within * this.batchSize, (within + 1) * this.batchSize)
        .map((i) => this.items[i] as T),
    };
  }

  private cached: { epoch: number; order: number[] } | null = null;

  private order(epoch: number): number[] {
    if (this.cached?.epoch === epoch) return this.cached.order;
    const order = this.items.map((_, i) => i);
    if (this.shuffle) {
      // Fisher–Yates with a generator per epoch.
      const rng = new Rng((this.seed * 1_000_003 + epoch) >>> 0);
      for (let i = order.length - 1; i > 0; i--) {
        const j = rng.int(i + 1);
        [order[i], order[j]] = [order[j] as number, order[i] as number];
      }
    }
    this.cached = { epoch, order };
    return order;
  }
}
