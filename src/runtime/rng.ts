/**
 * Counter-based mulberry32: draw k is a hash of seed + (k + 1) · 0x6d2b79f5 in 32-bit
 * integer arithmetic, which numpy reproduces bit for bit. Normals are Irwin-Hall sums of
 * 12 uniforms minus 6 (mean 0, variance 1): the sum of 12 multiples of 2^-33 is exact in a
 * double, so no transcendental function can round differently in Python.
 * (test/native/bf16_tolerance.py mirrors this generator; the tiny world draws from it too.)
 */
export class Rng {
  private state: number;

  constructor(seed: number) {
    this.state = seed >>> 0;
  }

  u32(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  }

  /** In [0, n). */
  int(n: number): number {
    return this.u32() % n;
  }

  /** In [0, 1). */
  uniform(): number {
    return this.u32() / 2 ** 32;
  }

  normal(): number {
    let sum = 0;
    for (let i = 0; i < 12; i++) sum += (this.u32() + 0.5) / 2 ** 32;
    return sum - 6;
  }
}
