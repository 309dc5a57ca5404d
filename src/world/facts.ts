/**
 * The facts of a tiny invented world, drawn from a seed: people born in cities, working for
 * organisations and mentored by other people; organisations based in cities; cities in
 * countries. Some of the people's facts are held out: the test questions are the ones that
 * need a held-out fact, which no training question (and so no demonstration or rewarded
 * answer) states, so a model can answer them only by searching. Every person still has
 * training questions: all names are tokens the model learns to write.
 */
import { Rng } from "../runtime/rng.js";
import { NameMaker } from "./names.js";

export interface WorldSizes {
  people: number;
  cities: number;
  countries: number;
  organisations: number;
  /** Extra passages that name people and cities but state none of the asked facts. */
  distractors: number;
  /**
   * Share of the people's facts (three each: birthplace, employer, mentor) held out; the
   * questions that need one form the test split. At most one fact per person.
   */
  testFraction: number;
}

export const DEFAULT_SIZES: WorldSizes = {
  people: 100,
  cities: 20,
  countries: 6,
  organisations: 16,
  distractors: 20,
  testFraction: 0.12,
};

export type Split = "train" | "test";

/** The relations a person has, each a fact that can be held out. */
export type PersonRelation = "born_in" | "works_for" | "mentor";
const PERSON_RELATIONS: PersonRelation[] = ["born_in", "works_for", "mentor"];

export interface Person {
  name: string;
  bornIn: string;
  worksFor: string;
  mentor: string;
  /** The fact only test questions need, if any. */
  heldOut: PersonRelation | null;
}

export interface City {
  name: string;
  country: string;
}

export interface Organisation {
  name: string;
  basedIn: string;
}

export interface Distractor {
  title: string;
  text: string;
}

export interface WorldFacts {
  seed: number;
  people: Person[];
  cities: City[];
  countries: string[];
  organisations: Organisation[];
  distractors: Distractor[];
}

/**
 * Words of the passages, questions, demonstrations and the Search-R1 prompt: no invented
 * name may analyse to one of them (a search for a name would match them).
 */
export const RESERVED_WORDS =
  "born city country cities organisation based works work mentor festival fair market held " +
  "spring summer autumn winter attended doc title employer which where who what need find " +
  "now memory answer given question must conduct reasoning inside think first every time " +
  "get new information after find lack knowledge call search engine query return top " +
  "searched results between many times want further external needed directly provide " +
  "without detailed illustrations example beijing helpful assistant system user";

const DISTRACTOR_KINDS = ["Festival", "Fair", "Market"];
const SEASONS = ["spring", "summer", "autumn", "winter"];

/** Fisher-Yates with the world's generator. */
export function shuffle<T>(rng: Rng, items: T[]): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = rng.int(i + 1);
    [items[i], items[j]] = [items[j] as T, items[i] as T];
  }
  return items;
}

function pick<T>(rng: Rng, items: readonly T[]): T {
  return items[rng.int(items.length)] as T;
}

function checkSizes(s: WorldSizes): void {
  const counts: [keyof WorldSizes, number][] = [
    ["people", 4],
    ["cities", 2],
    ["countries", 1],
    ["organisations", 1],
  ];
  for (const [key, least] of counts) {
    if (!Number.isInteger(s[key]) || s[key] < least) {
      throw new RangeError(`world ${key}: expected an integer of at least ${least}, got ${s[key]}`);
    }
  }
  if (s.countries > s.cities) {
    throw new RangeError(`world countries (${s.countries}) must not exceed cities (${s.cities})`);
  }
  if (!Number.isInteger(s.distractors) || s.distractors < 0) {
    throw new RangeError(`world distractors: expected an integer >= 0, got ${s.distractors}`);
  }
  if (!(s.testFraction > 0 && s.testFraction <= 1 / 3)) {
    throw new RangeError(
      `world testFraction: expected a number in (0, 1/3] (one fact in three per person at most), got ${s.testFraction}`,
    );
  }
}

export function makeFacts(seed: number, sizes: WorldSizes = DEFAULT_SIZES): WorldFacts {
  checkSizes(sizes);
  const rng = new Rng(seed);
  const names = new NameMaker(rng, RESERVED_WORDS);
  const countries = Array.from({ length: sizes.countries }, () => names.next("country"));
  // Every country gets at least one city: the first ones go round the countries in turn.
  const cities: City[] = Array.from({ length: sizes.cities }, (_, i) => ({
    name: names.next("city"),
    country: i < countries.length ? (countries[i] as string) : pick(rng, countries),
  }));
  const organisations: Organisation[] = Array.from({ length: sizes.organisations }, () => ({
    name: names.next("organisation"),
    basedIn: pick(rng, cities).name,
  }));

  const personNames = Array.from({ length: sizes.people }, () => names.next("person"));
  const people: Person[] = personNames.map((name) => {
    let mentor = pick(rng, personNames);
    while (mentor === name) mentor = pick(rng, personNames);
    return {
      name,
      bornIn: pick(rng, cities).name,
      worksFor: pick(rng, organisations).name,
      mentor,
      heldOut: null,
    };
  });
  const heldOut = Math.max(1, Math.round(sizes.people * 3 * sizes.testFraction));
  for (const person of shuffle(rng, [...people]).slice(0, heldOut)) {
    person.heldOut = pick(rng, PERSON_RELATIONS);
  }

  const distractors: Distractor[] = Array.from({ length: sizes.distractors }, (_, i) => {
    const city = cities[i % cities.length] as City;
    const kind = DISTRACTOR_KINDS[Math.floor(i / cities.length) % DISTRACTOR_KINDS.length];
    const title = `${city.name} ${kind}`;
    const a = pick(rng, people).name;
    let b = pick(rng, people).name;
    while (b === a) b = pick(rng, people).name;
    const season = pick(rng, SEASONS);
    return { title, text: `The ${title} is held every ${season}. ${a} and ${b} attended it.` };
  });

  return { seed, people, cities, countries, organisations, distractors };
}
