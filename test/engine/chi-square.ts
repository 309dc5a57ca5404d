/**
 * Pearson's chi-square goodness-of-fit test: the probability that counts drawn from
 * `probs` deviate at least as much as the observed ones. Tokens of probability 0 are
 * checked separately (one such sample is a failure on its own).
 */
export function chiSquare(
  counts: readonly number[],
  probs: readonly number[],
): { statistic: number; df: number; pValue: number } {
  const total = counts.reduce((a, b) => a + b, 0);
  let statistic = 0;
  let df = -1;
  probs.forEach((p, i) => {
    if (p <= 0) return;
    const expected = total * p;
    const d = (counts[i] ?? 0) - expected;
    statistic += (d * d) / expected;
    df++;
  });
  return { statistic, df, pValue: gammaQ(df / 2, statistic / 2) };
}

/** The regularised upper incomplete gamma function Q(a, x) (Numerical Recipes 6.2). */
export function gammaQ(a: number, x: number): number {
  if (x <= 0) return 1;
  if (x < a + 1) return 1 - gammaPSeries(a, x);
  return gammaQFraction(a, x);
}

function logGamma(z: number): number {
  // Lanczos approximation (g = 7, n = 9): ~15 digits for z > 0.
  const c = [
    0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
    -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6,
    1.5056327351493116e-7,
  ];
  if (z < 0.5) return Math.log(Math.PI / Math.sin(Math.PI * z)) - logGamma(1 - z);
  const zz = z - 1;
  let sum = c[0] as number;
  for (let i = 1; i < 9; i++) sum += (c[i] as number) / (zz + i);
  const t = zz + 7.5;
  return 0.5 * Math.log(2 * Math.PI) + (zz + 0.5) * Math.log(t) - t + Math.log(sum);
}

function gammaPSeries(a: number, x: number): number {
  let term = 1 / a;
  let sum = term;
  for (let n = 1; n < 1000; n++) {
    term *= x / (a + n);
    sum += term;
    if (Math.abs(term) < Math.abs(sum) * 1e-15) break;
  }
  return sum * Math.exp(-x + a * Math.log(x) - logGamma(a));
}

function gammaQFraction(a: number, x: number): number {
  const tiny = 1e-300;
  let b = x + 1 - a;
  let c = 1 / tiny;
  let d = 1 / b;
  let h = d;
  for (let i = 1; i < 1000; i++) {
    const an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (Math.abs(d) < tiny) d = tiny;
    c = b + an / c;
    if (Math.abs(c) < tiny) c = tiny;
    d = 1 / d;
    const delta = d * c;
    h *= delta;
    if (Math.abs(delta - 1) < 1e-15) break;
  }
  return Math.exp(-x + a * Math.log(x) - logGamma(a)) * h;
}
