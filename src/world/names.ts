/**
 * Invented names built from syllables, so that no language model can know the world's
 * facts and must search for them. Each kind of entity has its own shape (people two
 * syllables, cities a city-like ending, countries "-ia", organisations a kind word), so a
 * reader and a model can tell what a name stands for, and guesses can be of the right kind.
 */
import { Analyzer } from "../retrieval/analyzer.js";
import type { Rng } from "../runtime/rng.js";

const ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z"];
const CLUSTERS = ["br", "dr", "gr", "kr", "tr", "th", "sh", "st"];
const VOWELS = ["a", "e", "i", "o", "u"];
const CODAS = ["", "", "", "n", "r", "l", "s", "k", "m"];
const CITY_ENDINGS = ["ath", "or", "heim", "wick", "mere", "holt", "dun", "vel"];
const COUNTRY_ENDING = "ia";
const ORG_KINDS = ["Guild", "Works", "Bank", "Press", "Labs", "Trust"];

export type EntityKind = "person" | "city" | "country" | "organisation";

function pick<T>(rng: Rng, items: readonly T[]): T {
  return items[rng.int(items.length)] as T;
}

function syllable(rng: Rng, first: boolean): string {
  // Clusters only start a name: inside one they make long, hard-to-merge letter runs.
  const onset = first && rng.int(4) === 0 ? pick(rng, CLUSTERS) : pick(rng, ONSETS);
  return onset + pick(rng, VOWELS) + pick(rng, CODAS);
}

function capitalise(word: string): string {
  return word.charAt(0).toUpperCase() + word.slice(1);
}

function stem(rng: Rng, syllables: number): string {
  let out = "";
  for (let i = 0; i < syllables; i++) out += syllable(rng, i === 0);
  return out;
}

function candidate(rng: Rng, kind: EntityKind): string {
  switch (kind) {
    case "person":
      return capitalise(stem(rng, 2));
    case "city":
      return capitalise(syllable(rng, true) + pick(rng, CITY_ENDINGS));
    case "country":
      // "Timdi" + "ia" would double the vowel: Timdia.
      return capitalise(stem(rng, 2).replace(/[aeiou]$/, "") + COUNTRY_ENDING);
    case "organisation":
      return `${capitalise(stem(rng, 2))} ${pick(rng, ORG_KINDS)}`;
  }
}

/**
 * Hands out unique names. A name is refused when its distinctive word is short, when it
 * analyses (lower case, Porter stem) to the same BM25 term as a name already given or as
 * any reserved word (the prompt's and passages' own words): a search for one entity must
 * never match another by its name.
 */
export class NameMaker {
  private readonly analyzer = new Analyzer();
  private readonly taken = new Set<string>();

  constructor(
    private readonly rng: Rng,
    reservedText: string,
  ) {
    for (const term of this.analyzer.analyze(reservedText)) this.taken.add(term);
  }

  next(kind: EntityKind): string {
    for (let attempt = 0; attempt < 10_000; attempt++) {
      const name = candidate(this.rng, kind);
      const distinctive = name.split(" ")[0] as string;
      if (distinctive.length < 4) continue;
      const terms = this.analyzer.analyze(distinctive);
      if (terms.length !== 1 || this.taken.has(terms[0] as string)) continue;
      this.taken.add(terms[0] as string);
      return name;
    }
    throw new Error(`cannot invent another ${kind} name: the syllables are exhausted`);
  }
}
