/** xorshift32: the same sequence on every machine. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0 || 1;
  return () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) / 0x100000000;
  };
}

/**
 * A deterministic wiki-18-shaped corpus for retrieval tests: rows {"id", "contents"} with
 * a quoted title line, a Zipfian vocabulary mixed with stop words, capitals, possessives,
 * numbers, punctuation and a little non-Latin text; duplicates (for ties), a passage of
 * stop words only (length 0) and long passages (to exercise the length norms).
 */
export function generateCorpus(rows: number, seed = 1): string[] {
  const rand = seededRandom(seed);
  const syllables = [
    "ka",
    "lo",
    "ri",
    "ten",
    "mar",
    "sun",
    "vel",
    "dor",
    "pi",
    "que",
    "ston",
    "ber",
  ];
  const suffixes = ["", "", "", "s", "ing", "ed", "er", "ation", "ness", "'s", "ly"];
  const stems = Array.from({ length: 600 }, (_, i) => {
    let w = "";
    for (let x = i + 3; x > 0; x = Math.floor(x / syllables.length)) {
      w += syllables[x % syllables.length];
    }
    return w;
  });
  const extras = [
    "the",
    "of",
    "and",
    "in",
    "is",
    "a",
    "to",
    "Москва",
    "café",
    "1,000",
    "3.14",
    "U.S.",
  ];
  const word = () => {
    if (rand() < 0.2) return extras[Math.floor(rand() * extras.length)] as string;
    // Zipf-like: rank ~ exp(u · ln n)
    const stem = stems[
      Math.min(stems.length - 1, Math.floor(stems.length ** rand()) - 1)
    ] as string;
    const w = stem + (suffixes[Math.floor(rand() * suffixes.length)] as string);
    return rand() < 0.1 ? w[0]?.toUpperCase() + w.slice(1) : w;
  };
  const lines: string[] = [];
  for (let i = 0; i < rows; i++) {
    let text: string;
    if (i === 7) text = "the of and is a to in";
    else if (i % 97 === 5 && i > 97) text = JSON.parse(lines[i - 97] as string).contents;
    else {
      const n = i % 50 === 0 ? 400 + Math.floor(rand() * 200) : 5 + Math.floor(rand() * 80);
      const words = Array.from({ length: n }, word);
      text = `"${word()} ${word()}"\n${words.join(rand() < 0.5 ? " " : ", ")}.`;
    }
    lines.push(JSON.stringify({ id: String(i), contents: text }));
  }
  return lines;
}

/** Queries over the same vocabulary: 1–6 words, repeats, stop words, unknown words. */
export function generateQueries(corpus: readonly string[], n: number, seed = 2): string[] {
  const rand = seededRandom(seed);
  const pick = (k: number) => Math.floor(rand() * k);
  const words = corpus
    .slice(0, 200)
    .flatMap((l) => (JSON.parse(l).contents as string).split(/\s+/));
  return Array.from({ length: n }, (_, i) => {
    if (i === 0) return "the of and";
    if (i === 1) return "zzzunknownzzz";
    const k = 1 + pick(6);
    const q = Array.from({ length: k }, () => words[pick(words.length)] as string);
    if (i % 10 === 0) q.push(q[0] as string); // a repeated term weighs double
    return q.join(" ");
  });
}
