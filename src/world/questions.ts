/**
 * Questions about the world's people: three 1-hop kinds (the answer is in the person's own
 * passage) and three 2-hop kinds (the answer is in the passage of an entity named in the
 * person's passage). Each question carries its chain of hops (the search query, what the
 * search should find, the fact as a sentence) for the demonstrations and the tests. A
 * question is a test question when one of its hops is a held-out fact.
 */
import { Rng } from "../runtime/rng.js";
import type { WorldFacts } from "./facts.js";
import { type Split, shuffle } from "./facts.js";
import type { EntityKind } from "./names.js";

/** The two data sources; the eval report gives EM per source. */
export const DATA_SOURCES = ["world1hop", "world2hop"] as const;
export type DataSource = (typeof DATA_SOURCES)[number];

export type Relation = "born_in" | "works_for" | "mentor" | "located_in" | "based_in";

export interface Hop {
  relation: Relation;
  /** The entity whose passage states the fact (its title). */
  subject: string;
  answer: string;
  /** What a searcher types: the subject and the relation's word. */
  query: string;
  /** "where Zorvak was born": what the searcher is looking for, for its thoughts. */
  need: string;
  /** The fact as the passage states it. */
  fact: string;
}

export type QuestionType =
  | "born"
  | "employer"
  | "mentor"
  | "birth_country"
  | "employer_city"
  | "mentor_birthplace";

export interface WorldQuestion {
  /** FlashRAG-style id, unique within its source and split: `train_0`, `test_3`. */
  id: string;
  dataSource: DataSource;
  split: Split;
  type: QuestionType;
  question: string;
  answer: string;
  /** What kind of entity the answer is (a guess is drawn from the same kind). */
  answerKind: EntityKind;
  /** The first thought of a searcher: the plan, naming only what the question names. */
  plan: string;
  hops: Hop[];
}

function lookup<T extends { name: string }>(items: readonly T[], name: string): T {
  const found = items.find((i) => i.name === name);
  if (!found) throw new Error(`world: no entity named ${name}`);
  return found;
}

/** The hops the world's relations allow, stated as the passages state them. */
function hopsOf(world: WorldFacts) {
  const person = (name: string) => lookup(world.people, name);
  return {
    bornIn: (p: string): Hop => {
      const city = person(p).bornIn;
      return {
        relation: "born_in",
        subject: p,
        answer: city,
        query: `${p} born`,
        need: `where ${p} was born`,
        fact: `${p} was born in ${city}.`,
      };
    },
    worksFor: (p: string): Hop => {
      const org = person(p).worksFor;
      return {
        relation: "works_for",
        subject: p,
        answer: org,
        query: `${p} works for`,
        need: `which organisation ${p} works for`,
        fact: `${p} works for ${org}.`,
      };
    },
    mentor: (p: string): Hop => {
      const m = person(p).mentor;
      return {
        relation: "mentor",
        subject: p,
        answer: m,
        query: `${p} mentor`,
        need: `who the mentor of ${p} is`,
        fact: `The mentor of ${p} is ${m}.`,
      };
    },
    locatedIn: (c: string): Hop => {
      const country = lookup(world.cities, c).country;
      return {
        relation: "located_in",
        subject: c,
        answer: country,
        query: `${c} country`,
        need: `the country of ${c}`,
        fact: `${c} is a city in the country of ${country}.`,
      };
    },
    basedIn: (o: string): Hop => {
      const city = lookup(world.organisations, o).basedIn;
      return {
        relation: "based_in",
        subject: o,
        answer: city,
        query: `${o} based`,
        need: `where ${o} is based`,
        fact: `${o} is an organisation based in ${city}.`,
      };
    },
  };
}

type Draft = Omit<WorldQuestion, "id" | "split" | "answer">;

function questionsAbout(world: WorldFacts, p: string): Draft[] {
  const h = hopsOf(world);
  const born = h.bornIn(p);
  const works = h.worksFor(p);
  const mentor = h.mentor(p);
  return [
    {
      dataSource: "world1hop",
      type: "born",
      question: `Where was ${p} born?`,
      answerKind: "city",
      plan: `I need to find ${born.need}.`,
      hops: [born],
    },
    {
      dataSource: "world1hop",
      type: "employer",
      question: `Which organisation does ${p} work for?`,
      answerKind: "organisation",
      plan: `I need to find ${works.need}.`,
      hops: [works],
    },
    {
      dataSource: "world1hop",
      type: "mentor",
      question: `Who is the mentor of ${p}?`,
      answerKind: "person",
      plan: `I need to find ${mentor.need}.`,
      hops: [mentor],
    },
    {
      dataSource: "world2hop",
      type: "birth_country",
      question: `In which country was ${p} born?`,
      answerKind: "country",
      plan: `I need to find ${born.need}, then the country of that city.`,
      hops: [born, h.locatedIn(born.answer)],
    },
    {
      dataSource: "world2hop",
      type: "employer_city",
      question: `In which city is the organisation that ${p} works for based?`,
      answerKind: "city",
      plan: `I need to find ${works.need}, then where it is based.`,
      hops: [works, h.basedIn(works.answer)],
    },
    {
      dataSource: "world2hop",
      type: "mentor_birthplace",
      question: `Where was the mentor of ${p} born?`,
      answerKind: "city",
      plan: `I need to find ${mentor.need}, then where the mentor was born.`,
      hops: [mentor, h.bornIn(mentor.answer)],
    },
  ];
}

/** Whether a hop is a person's held-out fact. */
export function isHeldOut(world: WorldFacts, hop: Hop): boolean {
  return world.people.some((p) => p.name === hop.subject && p.heldOut === hop.relation);
}

/**
 * Every question about every person, in test when it needs a held-out fact, shuffled
 * within each source and split, with ids numbered in that order.
 */
export function makeQuestions(world: WorldFacts): WorldQuestion[] {
  const rng = new Rng((world.seed ^ 0x51ed27) >>> 0);
  const all = world.people.flatMap((p) => questionsAbout(world, p.name));
  const splitOf = (d: Draft): Split => (d.hops.some((h) => isHeldOut(world, h)) ? "test" : "train");
  const out: WorldQuestion[] = [];
  for (const split of ["train", "test"] as const) {
    for (const source of DATA_SOURCES) {
      const drafts = all.filter((d) => d.dataSource === source && splitOf(d) === split);
      shuffle(rng, drafts).forEach((d, i) => {
        const answer = (d.hops[d.hops.length - 1] as Hop).answer;
        const { dataSource, type, question, answerKind, plan, hops } = d;
        out.push({
          id: `${split}_${i}`,
          dataSource,
          split,
          type,
          question,
          answer,
          answerKind,
          plan,
          hops,
        });
      });
    }
  }
  return out;
}
