import { readdirSync } from "node:fs";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { formatSummary, type PreprocessSummary, runPreprocess } from "../../src/data/preprocess.js";
import { InputError } from "../../src/runtime/errors.js";
import {
  config,
  describeParquet,
  duckdb,
  jsonl,
  put,
  putGzip,
  putQaParquet,
  readParquet,
  recordingProgress,
  tempDir,
} from "./helpers.js";

/** The Search-R1 prompt, written out literally so the test does not trust the template file. */
function searchR1Prompt(question: string): string {
  return `Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new information. After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> and it will return the top searched results between <information> and </information>. You can search as many times as your want. If you find no further external knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: ${question}\n`;
}

function r1NoSearchPrompt(question: string): string {
  return `Answer the given question. You should first have a reasoning process in mind and then provides the answer. Show your reasoning in <think> </think> tags and return the final answer in <answer> </answer> tags, for example <answer> Beijing </answer>. Question: ${question}\n`;
}

const CUSTOM = "my_qa-2024";

/** nq (train + test jsonl), hotpotqa (train.jsonl.gz + dev.parquet), a custom test-only set. */
function writeFlashRag(input: string) {
  const files = {
    nqTrain: put(
      path.join(input, "nq", "train.jsonl"),
      [
        jsonl([
          {
            id: "train_0",
            question: "Who wrote « Les Misérables » — in 1862",
            golden_answers: ["Victor Hugo"],
          },
          {
            id: "train_1",
            question: "  what is the capital of france?  ",
            golden_answers: ["Paris", "paris", "Paris, France"],
          },
        ]),
        "\n",
        jsonl([
          { id: "train_2", question: "when did it end", golden_answers: [] },
          { id: 3, question: "how many legs does a spider have?", golden_answers: ["8", "eight"] },
        ]),
      ].join(""),
    ),
    nqTest: put(
      path.join(input, "nq", "test.jsonl"),
      jsonl([
        {
          id: "test_0",
          question: "who sings does he love me with reba",
          golden_answers: ["Linda Davis"],
        },
        { question: "where is 東京タワー?", golden_answers: ["Minato, Tokyo"] },
      ]),
    ),
    hotpotTrain: putGzip(
      path.join(input, "hotpotqa", "train.jsonl.gz"),
      jsonl([
        {
          id: "5a8b57f25542995d1e6f1371",
          question: "Were Scott Derrickson and Ed Wood of the same nationality?",
          golden_answers: ["yes"],
        },
        { id: "h1", golden_answers: ["no"] },
        {
          id: "h2",
          question: "Which magazine was started first, Arthur's Magazine or First for Women",
          golden_answers: ["Arthur's Magazine"],
        },
      ]),
    ),
    hotpotDev: putQaParquet(path.join(input, "hotpotqa", "dev.parquet"), [
      {
        id: "d0",
        question: "What government position was held by the woman who portrayed Corliss Archer?",
        golden_answers: ["Chief of Protocol"],
      },
      {
        id: "d1",
        question: " 2014 S/S is the debut album of a group formed by who ",
        golden_answers: ["YG Entertainment", "YG"],
      },
    ]),
    customTest: put(
      path.join(input, CUSTOM, "test.jsonl"),
      `42\n${jsonl([{ id: "c0", question: "Çà et là: what is 2+2", golden_answers: ["4", "four"] }])}`,
    ),
  };
  return files;
}

interface Expected {
  id: string | null;
  question: string;
  normalized: string;
  answers: string[];
  source: string;
  split: "train" | "test";
  index: number;
}

function expectedRow(e: Expected, prompt = searchR1Prompt) {
  return {
    id: e.id,
    question: e.normalized,
    golden_answers: e.answers,
    data_source: e.source,
    prompt: [{ role: "user", content: prompt(e.normalized) }],
    ability: "fact-reasoning",
    reward_model: { style: "rule", ground_truth: { target: e.answers } },
    // DuckDB renders BIGINT as a string in JSON.
    extra_info: {
      split: e.split,
      index: String(e.index),
      uid: `${e.source}-${e.split}-${e.index}`,
    },
  };
}

describe("runPreprocess", () => {
  let tmp: ReturnType<typeof tempDir>;
  let input: string;
  let out: string;
  beforeEach(() => {
    tmp = tempDir();
    input = path.join(tmp.dir, "flashrag");
    out = path.join(tmp.dir, "out", "nested");
  });
  afterEach(() => tmp.cleanup());

  it("writes Search-R1 train and test parquet, checked field by field with DuckDB", async () => {
    const files = writeFlashRag(input);
    const progress = recordingProgress();
    const summary = await runPreprocess(
      config({ datasets: ["nq", "hotpotqa", CUSTOM], input, out }),
      progress,
    );

    const trainFile = path.join(out, "train.parquet");
    const testFile = path.join(out, "test.parquet");
    expect(readdirSync(out).sort()).toEqual(["test.parquet", "train.parquet"]);

    expect(await describeParquet(trainFile)).toEqual([
      ["id", "VARCHAR"],
      ["question", "VARCHAR"],
      ["golden_answers", "VARCHAR[]"],
      ["data_source", "VARCHAR"],
      ["prompt", 'STRUCT("role" VARCHAR, "content" VARCHAR)[]'],
      ["ability", "VARCHAR"],
      ["reward_model", 'STRUCT(style VARCHAR, ground_truth STRUCT("target" VARCHAR[]))'],
      ["extra_info", 'STRUCT(split VARCHAR, "index" BIGINT, uid VARCHAR)'],
    ]);
    expect(await describeParquet(testFile)).toEqual(await describeParquet(trainFile));

    const train = "train";
    expect(await readParquet(trainFile)).toEqual([
      expectedRow({
        id: "train_0",
        question: "Who wrote « Les Misérables » — in 1862",
        normalized: "Who wrote « Les Misérables » — in 1862?",
        answers: ["Victor Hugo"],
        source: "nq",
        split: train,
        index: 0,
      }),
      expectedRow({
        id: "train_1",
        question: "  what is the capital of france?  ",
        normalized: "what is the capital of france?",
        answers: ["Paris", "paris", "Paris, France"],
        source: "nq",
        split: train,
        index: 1,
      }),
      // train_2 (index 2) has no golden answers; the blank line between does not count.
      expectedRow({
        id: "3",
        question: "how many legs does a spider have?",
        normalized: "how many legs does a spider have?",
        answers: ["8", "eight"],
        source: "nq",
        split: train,
        index: 3,
      }),
      expectedRow({
        id: "5a8b57f25542995d1e6f1371",
        question: "Were Scott Derrickson and Ed Wood of the same nationality?",
        normalized: "Were Scott Derrickson and Ed Wood of the same nationality?",
        answers: ["yes"],
        source: "hotpotqa",
        split: train,
        index: 0,
      }),
      // h1 (index 1) has no question.
      expectedRow({
        id: "h2",
        question: "Which magazine was started first, Arthur's Magazine or First for Women",
        normalized: "Which magazine was started first, Arthur's Magazine or First for Women?",
        answers: ["Arthur's Magazine"],
        source: "hotpotqa",
        split: train,
        index: 2,
      }),
    ]);

    const test = "test";
    const testRows = await readParquet(testFile);
    expect(testRows).toEqual([
      expectedRow({
        id: "test_0",
        question: "who sings does he love me with reba",
        normalized: "who sings does he love me with reba?",
        answers: ["Linda Davis"],
        source: "nq",
        split: test,
        index: 0,
      }),
      expectedRow({
        id: null,
        question: "where is 東京タワー?",
        normalized: "where is 東京タワー?",
        answers: ["Minato, Tokyo"],
        source: "nq",
        split: test,
        index: 1,
      }),
      // hotpotqa has no test split: dev.parquet stands in, as in Search-R1's merge.
      expectedRow({
        id: "d0",
        question: "What government position was held by the woman who portrayed Corliss Archer?",
        normalized: "What government position was held by the woman who portrayed Corliss Archer?",
        answers: ["Chief of Protocol"],
        source: "hotpotqa",
        split: test,
        index: 0,
      }),
      expectedRow({
        id: "d1",
        question: " 2014 S/S is the debut album of a group formed by who ",
        normalized: "2014 S/S is the debut album of a group formed by who?",
        answers: ["YG Entertainment", "YG"],
        source: "hotpotqa",
        split: test,
        index: 1,
      }),
      // Line 1 (`42`) is not an object, so c0 is index 1.
      expectedRow({
        id: "c0",
        question: "Çà et là: what is 2+2",
        normalized: "Çà et là: what is 2+2?",
        answers: ["4", "four"],
        source: CUSTOM,
        split: test,
        index: 1,
      }),
    ]);
    const uids = testRows.map((r) => (r.extra_info as { uid: string }).uid);
    expect(new Set(uids).size).toBe(uids.length);

    expect(summary).toEqual({
      sources: [
        {
          split: "train",
          dataSource: "nq",
          file: files.nqTrain,
          rows: 3,
          skipped: 1,
          skipReasons: { "golden_answers is empty": 1 },
        },
        {
          split: "train",
          dataSource: "hotpotqa",
          file: files.hotpotTrain,
          rows: 2,
          skipped: 1,
          skipReasons: { "question is missing": 1 },
        },
        {
          split: "test",
          dataSource: "nq",
          file: files.nqTest,
          rows: 2,
          skipped: 0,
          skipReasons: {},
        },
        {
          split: "test",
          dataSource: "hotpotqa",
          file: files.hotpotDev,
          rows: 2,
          skipped: 0,
          skipReasons: {},
        },
        {
          split: "test",
          dataSource: CUSTOM,
          file: files.customTest,
          rows: 1,
          skipped: 1,
          skipReasons: { "record is not a JSON object": 1 },
        },
      ],
      leftOut: [
        {
          split: "train",
          dataSource: CUSTOM,
          lookedFor: ["train.jsonl", "train.jsonl.gz", "train.parquet"],
        },
      ],
      outputs: [
        { split: "train", path: trainFile, rows: 5 },
        { split: "test", path: testFile, rows: 5 },
      ],
      skipped: [],
    } satisfies PreprocessSummary);

    expect(progress.logs).toEqual([
      `warning: ${files.nqTrain}:4: golden_answers is empty; row skipped`,
      `warning: ${files.hotpotTrain}:2: question is missing; row skipped`,
      `warning: ${files.customTest}:1: record is not a JSON object; row skipped`,
    ]);
    expect(progress.tasks.map((t) => [t.label, t.unit, t.done === t.total])).toEqual([
      ["train: nq train.jsonl", "B", true],
      ["train: hotpotqa train.jsonl.gz", "B", true],
      ["test: nq test.jsonl", "B", true],
      ["test: hotpotqa dev.parquet", "rows", true],
      [`test: ${CUSTOM} test.jsonl`, "B", true],
    ]);
  });

  it("renders with r1-no-search or a user's template file", async () => {
    writeFlashRag(input);
    await runPreprocess(
      config({ input, out, splits: ["test"], template: "r1-no-search" }),
      recordingProgress(),
    );
    const [first] = await readParquet(path.join(out, "test.parquet"));
    expect(first?.prompt).toEqual([
      { role: "user", content: r1NoSearchPrompt("who sings does he love me with reba?") },
    ]);
    expect(readdirSync(out)).toEqual(["test.parquet"]);

    const mine = put(path.join(tmp.dir, "mine.txt"), "<q>{question}</q> again {question}");
    await runPreprocess(
      config({ input, out, splits: ["test"], template: mine, overwrite: true }),
      recordingProgress(),
    );
    const rows = await readParquet(path.join(out, "test.parquet"));
    expect(rows.map((r) => (r.prompt as { content: string }[])[0]?.content)).toEqual([
      "<q>who sings does he love me with reba?</q> again who sings does he love me with reba?",
      "<q>where is 東京タワー?</q> again where is 東京タワー?",
    ]);
  });

  it("fails in strict mode at the first invalid row with file:line, writing nothing", async () => {
    const files = writeFlashRag(input);
    const run = runPreprocess(config({ input, out, strict: true }), recordingProgress());
    await expect(run).rejects.toThrow(InputError);
    await expect(run).rejects.toThrow(`${files.nqTrain}:4: golden_answers is empty`);
    expect(readdirSync(out)).toEqual([]);
  });

  it("caps warnings per file and counts the rest", async () => {
    const rows = Array.from({ length: 25 }, (_, i) => ({
      id: `b${i}`,
      question: "",
      golden_answers: ["x"],
    }));
    put(
      path.join(input, "nq", "train.jsonl"),
      jsonl([{ question: "ok", golden_answers: ["y"] }, ...rows]),
    );
    const progress = recordingProgress();
    const summary = await runPreprocess(config({ input, out, splits: ["train"] }), progress);
    expect(progress.logs).toHaveLength(11);
    expect(progress.logs[9]).toMatch(/train\.jsonl:11: question is empty; row skipped$/);
    expect(progress.logs[10]).toMatch(/train\.jsonl: 15 more invalid rows skipped$/);
    expect(summary.sources[0]).toMatchObject({
      rows: 1,
      skipped: 25,
      skipReasons: { "question is empty": 25 },
    });
  });

  it("leaves no output and no temporary file when a later dataset is malformed", async () => {
    writeFlashRag(input);
    const bad = put(
      path.join(input, "hotpotqa", "train.jsonl"),
      '{"question": "q", "golden_answers": ["a"]}\n{"question": \n',
    );
    const run = runPreprocess(
      config({ input, out, datasets: ["nq", "hotpotqa"] }),
      recordingProgress(),
    );
    await expect(run).rejects.toThrow(InputError);
    await expect(run).rejects.toThrow(new RegExp(`^${escapeRegExp(bad)}:2: malformed JSON \\(`));
    expect(readdirSync(out)).toEqual([]);
  });

  it("removes a finished train file when the test split fails", async () => {
    writeFlashRag(input);
    put(path.join(input, "nq", "test.jsonl"), "{]\n");
    await expect(runPreprocess(config({ input, out }), recordingProgress())).rejects.toThrow(
      "test.jsonl:1: malformed JSON",
    );
    expect(readdirSync(out)).toEqual([]);
  });

  it("stops and cleans up when aborted mid-file", async () => {
    const many = Array.from({ length: 3000 }, (_, i) => ({
      question: `q${i}`,
      golden_answers: ["a"],
    }));
    put(path.join(input, "nq", "train.jsonl"), jsonl(many));
    put(path.join(input, "nq", "test.jsonl"), jsonl(many));
    const controller = new AbortController();
    const progress = recordingProgress(() => controller.abort());
    await expect(
      runPreprocess(config({ input, out }), progress, controller.signal),
    ).rejects.toThrow(/abort/i);
    expect(progress.tasks).toHaveLength(1);
    expect(readdirSync(out)).toEqual([]);
  });

  it("reports missing folders and template problems before creating the output folder", async () => {
    const missing = path.join(tmp.dir, "nowhere");
    await expect(
      runPreprocess(config({ input: missing, out }), recordingProgress()),
    ).rejects.toThrow(`input folder ${missing} `);
    writeFlashRag(input);
    await expect(
      runPreprocess(config({ input, out, datasets: ["nq", "triviaqa"] }), recordingProgress()),
    ).rejects.toThrow(`dataset folder ${path.join(input, "triviaqa")} does not exist`);
    await expect(
      runPreprocess(config({ input, out, template: "search-r9" }), recordingProgress()),
    ).rejects.toThrow("expected one of r1-no-search, search-r1");
    const noPlaceholder = put(path.join(tmp.dir, "t.txt"), "no placeholder\n");
    await expect(
      runPreprocess(config({ input, out, template: noPlaceholder }), recordingProgress()),
    ).rejects.toThrow(`template ${noPlaceholder}: has no {question} placeholder`);
    expect(readdirSync(tmp.dir)).not.toContain("out");
  });

  it("converts a file larger than one row group in bounded row groups", async () => {
    // The reader's own 200,000-row streaming test is in flashrag.test.ts; writing is the slow
    // part (~70k rows/s), so this one stays at 60,000 rows to keep the suite fast.
    const lines: string[] = [];
    for (let i = 0; i < 60_000; i++) {
      lines.push(`{"id":"${i}","question":"question number ${i}","golden_answers":["${i}"]}\n`);
    }
    put(path.join(input, "nq", "train.jsonl"), lines.join(""));
    const summary = await runPreprocess(
      config({ input, out, splits: ["train"] }),
      recordingProgress(),
    );
    const file = path.join(out, "train.parquet");
    expect(summary.outputs).toEqual([{ split: "train", path: file, rows: 60_000 }]);
    const [stats] = await duckdbStats(file);
    expect(stats).toEqual({ n: "60000", uids: "60000", max_index: "59999", groups: "6" });
  });
});

function duckdbStats(file: string) {
  return duckdb(
    `select count(*) as n, count(distinct extra_info.uid) as uids, max(extra_info.index) as max_index,
       (select count(distinct row_group_id) from parquet_metadata('${file}')) as groups
     from read_parquet('${file}')`,
  );
}

describe("formatSummary", () => {
  it("prints an aligned table, the skip reasons, datasets left out and the files written", () => {
    const text = formatSummary({
      sources: [
        {
          split: "train",
          dataSource: "nq",
          file: "in/nq/train.jsonl",
          rows: 79168,
          skipped: 2,
          skipReasons: { "golden_answers is empty": 2 },
        },
        {
          split: "test",
          dataSource: "hotpotqa",
          file: "in/hotpotqa/dev.parquet",
          rows: 7405,
          skipped: 0,
          skipReasons: {},
        },
      ],
      leftOut: [
        {
          split: "train",
          dataSource: "bamboogle",
          lookedFor: ["train.jsonl", "train.jsonl.gz", "train.parquet"],
        },
      ],
      outputs: [
        { split: "train", path: "out/train.parquet", rows: 79168 },
        { split: "test", path: "out/test.parquet", rows: 7405 },
      ],
      skipped: [],
    });
    expect(text).toBe(
      [
        "split  source    file                      rows  skipped",
        "train  nq        in/nq/train.jsonl        79168        2",
        "test   hotpotqa  in/hotpotqa/dev.parquet   7405        0",
        "",
        "skipped rows:",
        "  train nq: golden_answers is empty (2)",
        "",
        "left out (no file for the split):",
        "  train bamboogle: looked for train.jsonl, train.jsonl.gz, train.parquet",
        "",
        "written:",
        "  out/train.parquet  79168 rows",
        "  out/test.parquet    7405 rows",
      ].join("\n"),
    );
  });

  it("names an output file that was not written and why", () => {
    const text = formatSummary({
      sources: [
        {
          split: "test",
          dataSource: "bamboogle",
          file: "in/bamboogle/test.jsonl",
          rows: 125,
          skipped: 0,
          skipReasons: {},
        },
      ],
      leftOut: [],
      outputs: [{ split: "test", path: "out/test.parquet", rows: 125 }],
      skipped: [
        { split: "train", path: "out/train.parquet", reason: "no dataset has a train split" },
      ],
    });
    expect(text).toContain(
      "\nnot written:\n  out/train.parquet: no dataset has a train split\n\nwritten:\n  out/test.parquet  125 rows",
    );
  });
});

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
