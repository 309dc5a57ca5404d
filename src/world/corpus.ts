/**
 * The world as a Search-R1 corpus: one passage per entity, stating its facts in the same
 * words the questions and searches use, plus distractor passages; rows
 * `{"id": "<row>", "contents": "\"<Title>\"\n<text>"}` in a seeded order.
 */
import { Rng } from "../runtime/rng.js";
import { shuffle, type WorldFacts } from "./facts.js";

export interface CorpusRow {
  id: string;
  contents: string;
}

/** "A", "A and B", "A, B and C". */
function listed(names: readonly string[]): string {
  if (names.length <= 1) return names.join("");
  return `${names.slice(0, -1).join(", ")} and ${names[names.length - 1]}`;
}

/** Title and text of every passage, before ordering. */
function passages(world: WorldFacts): [string, string][] {
  const out: [string, string][] = [];
  for (const p of world.people) {
    out.push([
      p.name,
      `${p.name} was born in ${p.bornIn}. ${p.name} works for ${p.worksFor}. ` +
        `The mentor of ${p.name} is ${p.mentor}.`,
    ]);
  }
  for (const c of world.cities) {
    out.push([c.name, `${c.name} is a city in the country of ${c.country}.`]);
  }
  for (const country of world.countries) {
    const cities = world.cities.filter((c) => c.country === country).map((c) => c.name);
    const noun = cities.length === 1 ? "city is" : "cities are";
    out.push([country, `${country} is a country. Its ${noun} ${listed(cities)}.`]);
  }
  for (const o of world.organisations) {
    out.push([o.name, `${o.name} is an organisation based in ${o.basedIn}.`]);
  }
  for (const d of world.distractors) out.push([d.title, d.text]);
  return out;
}

/** The corpus rows; a row's id is its row number, as the dense index position is. */
export function makeCorpus(world: WorldFacts): CorpusRow[] {
  const rng = new Rng((world.seed ^ 0xc0a95) >>> 0);
  return shuffle(rng, passages(world)).map(([title, text], i) => ({
    id: String(i),
    contents: `"${title}"\n${text}`,
  }));
}

/** The jsonl file's text: one row per line. */
export function corpusJsonl(rows: readonly CorpusRow[]): string {
  return rows.map((r) => `${JSON.stringify({ id: r.id, contents: r.contents })}\n`).join("");
}
