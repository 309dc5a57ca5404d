import { spawn } from "node:child_process";
import { existsSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { jsonl, put, putGzip, putQaParquet, readParquet, tempDir } from "./data/helpers.js";
import { BIN, runCli } from "./helpers/cli.js";

const { dir, cleanup } = tempDir();
afterAll(cleanup);

const input = join(dir, "FlashRAG_datasets");
put(
  join(input, "nq", "train.jsonl"),
  jsonl([
    {
      id: "train_0",
      question: "total number of death row inmates in the us",
      golden_answers: ["2,718"],
    },
    {
      id: "train_1",
      question: "  Qui a écrit « Les Misérables » ?  ",
      golden_answers: ["Victor Hugo", "Hugo"],
    },
    { id: "train_2", question: "bad row", golden_answers: [] },
  ]),
);
put(
  join(input, "nq", "test.jsonl"),
  jsonl([
    {
      id: "test_0",
      question: "who got the first nobel prize in physics",
      golden_answers: ["Wilhelm Conrad Röntgen"],
    },
  ]),
);
putGzip(
  join(input, "hotpotqa", "train.jsonl.gz"),
  jsonl([
    {
      id: "5a7a",
      question: "Which magazine was started first?",
      golden_answers: ["Arthur's Magazine"],
    },
  ]),
);
putQaParquet(join(input, "hotpotqa", "dev.parquet"), [
  {
    id: "5a8b",
    question: "Were Scott Derrickson and Ed Wood of the same nationality",
    golden_answers: ["yes"],
  },
]);

const PROMPT_HEAD =
  "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new information. After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> and it will return the top searched results between <information> and </information>. You can search as many times as your want. If you find no further external knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: ";

const VERL_PROMPT_HEAD =
  "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new information. After reasoning, if you find you lack some knowledge, you can call a search engine by <tool_call> query </tool_call> and it will return the top searched results between <tool_response> and </tool_response>. You can search as many times as your want. If you find no further external knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: ";

const parquetFiles = (folder: string) => (existsSync(folder) ? readdirSync(folder) : []);

describe("searchr1 preprocess (built CLI)", () => {
  it("writes nq_hotpotqa train/test parquet and prints the summary", async () => {
    const out = join(dir, "nq_hotpotqa");
    const r = runCli(["preprocess", "nq", "hotpotqa", "--input", input, "--out", out]);
    expect(r.code).toBe(0);
    expect(r.stderr).toContain("train.jsonl:3: golden_answers is empty; row skipped");
    expect(r.stdout).toMatch(/^split\s+source\s+file\s+rows\s+skipped$/m);
    expect(r.stdout).toMatch(/^train\s+nq\s+\S+train\.jsonl\s+2\s+1$/m);
    expect(r.stdout).toMatch(/^test\s+hotpotqa\s+\S+dev\.parquet\s+1\s+0$/m);
    expect(parquetFiles(out).sort()).toEqual(["test.parquet", "train.parquet"]);

    const train = await readParquet(join(out, "train.parquet"));
    expect(train.map((row) => row.data_source)).toEqual(["nq", "nq", "hotpotqa"]);
    expect(train[1]).toEqual({
      id: "train_1",
      question: "Qui a écrit « Les Misérables » ?",
      golden_answers: ["Victor Hugo", "Hugo"],
      data_source: "nq",
      prompt: [{ role: "user", content: `${PROMPT_HEAD}Qui a écrit « Les Misérables » ?\n` }],
      ability: "fact-reasoning",
      reward_model: { style: "rule", ground_truth: { target: ["Victor Hugo", "Hugo"] } },
      extra_info: { split: "train", index: "1", uid: "nq-train-1" },
    });
    expect(train[0]?.prompt).toEqual([
      { role: "user", content: `${PROMPT_HEAD}total number of death row inmates in the us?\n` },
    ]);
    const test = await readParquet(join(out, "test.parquet"));
    expect(test.map((row) => (row.extra_info as { uid: string }).uid)).toEqual([
      "nq-test-0",
      "hotpotqa-test-0",
    ]);
  });

  it("--format verl writes verl's preprocess_search_r1_dataset.py rows (read back by DuckDB)", async () => {
    const out = join(dir, "verl");
    const r = runCli([
      "preprocess",
      "nq",
      "hotpotqa",
      "--input",
      input,
      "--out",
      out,
      "--format",
      "verl",
    ]);
    expect(r.code, r.stderr).toBe(0);
    const train = await readParquet(join(out, "train.parquet"));
    expect(Object.keys(train[0] ?? {})).toEqual([
      "data_source",
      "prompt",
      "ability",
      "reward_model",
      "extra_info",
      "metadata",
    ]);
    const question = "Which magazine was started first?";
    const gt = { target: ["Arthur's Magazine"] };
    // The third row of the merged file, the first of hotpotqa: verl's index is the file's.
    expect(train[2]).toEqual({
      data_source: "searchR1_hotpotqa",
      prompt: [
        { role: "system", content: "You are a helpful and harmless assistant." },
        { role: "user", content: `${VERL_PROMPT_HEAD}${question}` },
      ],
      ability: "fact-reasoning",
      reward_model: { style: "rule", ground_truth: gt },
      extra_info: {
        index: "2",
        need_tools_kwargs: true,
        question,
        split: "train",
        tools_kwargs: {
          search: {
            create_kwargs: { ground_truth: gt, question, data_source: "searchR1_hotpotqa" },
          },
        },
      },
      metadata: null,
    });
    expect(train.map((row) => (row.extra_info as { question: string }).question)).toEqual([
      "total number of death row inmates in the us?",
      "Qui a écrit « Les Misérables » ?",
      question,
    ]);
  });

  it("reads the same options from a YAML config, with overrides on top", async () => {
    const out = join(dir, "from-config");
    const cfg = join(dir, "pre.yaml");
    writeFileSync(
      cfg,
      `datasets: [nq]\ninput: ${input}\nout: ${join(dir, "unused")}\nsplits: [train, test]\n`,
    );
    const r = runCli(["preprocess", "--config", cfg, `out=${out}`, "splits=[test]", "--quiet"]);
    expect(r.code).toBe(0);
    expect(r.stderr).toBe("");
    expect(parquetFiles(out)).toEqual(["test.parquet"]);
    expect(existsSync(join(dir, "unused"))).toBe(false);
  });

  it("writes test.parquet for test-only datasets and says train.parquet was skipped and why", async () => {
    const only = join(dir, "test-only");
    put(
      join(only, "bamboogle", "test.jsonl"),
      jsonl([{ id: "b0", question: "who was the first", golden_answers: ["x"] }]),
    );
    const out = join(dir, "bamboogle-out");
    const r = runCli(["preprocess", "bamboogle", "--input", only, "--out", out, "--quiet"]);
    expect(r.code).toBe(0);
    expect(parquetFiles(out)).toEqual(["test.parquet"]);
    expect((await readParquet(join(out, "test.parquet"))).length).toBe(1);
    expect(r.stdout).toContain(
      `not written:\n  ${join(out, "train.parquet")}: no dataset has a train split; looked for train.jsonl, train.jsonl.gz, train.parquet in ${join(only, "bamboogle")}`,
    );
    // Asked for explicitly, a train split that no dataset has is an error, and nothing is written.
    for (const splits of ["train", "train,test"]) {
      const out2 = join(dir, `bamboogle-${splits}`);
      const e = runCli([
        "preprocess",
        "bamboogle",
        "--input",
        only,
        "--out",
        out2,
        "--splits",
        splits,
      ]);
      expect(e.code).toBe(1);
      expect(e.stderr).toContain("searchr1: error: no dataset has a train split");
      expect(parquetFiles(out2)).toEqual([]);
    }
  });

  it("--strict stops at the bad row with file:line, exit 1, and writes nothing", () => {
    const out = join(dir, "strict");
    const r = runCli(["preprocess", "nq", "--input", input, "--out", out, "--strict", "--quiet"]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/searchr1: error: .*nq\/train\.jsonl:3: golden_answers is empty/);
    expect(parquetFiles(out)).toEqual([]);
  });

  it("names a missing dataset folder (exit 1) and asks for datasets when none are given (exit 2)", () => {
    const a = runCli(["preprocess", "nq", "triviaqa", "--input", input, "--out", join(dir, "x")]);
    expect(a.code).toBe(1);
    expect(a.stderr).toContain(join(input, "triviaqa"));
    const b = runCli(["preprocess", "--input", input, "--out", join(dir, "x")]);
    expect(b.code).toBe(2);
    expect(b.stderr).toContain(
      'missing required key "datasets": expected list of string (set it with <dataset...> arguments',
    );
  });

  it("Ctrl-C stops a long conversion with exit 130 and leaves no files", async () => {
    const big = join(dir, "big");
    const rows = Array.from({ length: 400_000 }, (_, i) => ({
      id: `q${i}`,
      question: `question number ${i}`,
      golden_answers: [`a${i}`],
    }));
    put(join(big, "nq", "train.jsonl"), jsonl(rows));
    const out = join(dir, "interrupted");
    const child = spawn(process.execPath, [
      BIN,
      "preprocess",
      "nq",
      "--input",
      big,
      "--out",
      out,
      "--splits",
      "train",
    ]);
    let stderr = "";
    child.stderr.on("data", (d) => {
      stderr += d;
    });
    // Interrupt once the conversion is under way: its temporary output file exists.
    const deadline = Date.now() + 20_000;
    while (!parquetFiles(out).some((f) => f.includes(".tmp-")) && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    child.kill("SIGINT");
    const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
    expect(code).toBe(130);
    expect(stderr).toContain("interrupted; nothing was written");
    expect(parquetFiles(out)).toEqual([]);
  });
});
