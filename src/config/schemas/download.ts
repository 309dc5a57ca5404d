import { z } from "zod";
import type { CommandConfigSpec } from "../resolve.js";

export const downloadSchema = z.strictObject({
  save_path: z.string().min(1).describe("folder the files go to"),
  what: z
    .array(z.string().min(1))
    .default([])
    .describe(
      "named selections (e5-flat, corpus, bm25, e5-hnsw, nq-hotpotqa, flashrag:<ds>, model:<repo>); empty = Search-R1's set",
    ),
  repo: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe("a hub repository OWNER/NAME instead of named selections"),
  repo_type: z.enum(["model", "dataset"]).default("dataset").describe("kind of --repo"),
  include: z
    .array(z.string().min(1))
    .default([])
    .describe("glob patterns of files to take from --repo"),
  revision: z.string().min(1).default("main").describe("branch, tag or commit"),
  endpoint: z.string().url().default("https://huggingface.co").describe("hub URL"),
  token: z.string().min(1).nullable().default(null).describe("hub access token (gated repos)"),
  connections: z
    .number()
    .int()
    .positive()
    .default(8)
    .describe("parallel range requests per large file"),
  parallel_files: z.number().int().positive().default(4).describe("files downloaded at once"),
  piece_mb: z
    .number()
    .positive()
    .default(16)
    .describe("size of each range request when a file is split (MiB)"),
  retries: z
    .number()
    .int()
    .min(0)
    .default(8)
    .describe("retries after 5xx answers, timeouts and dropped connections"),
  backoff_s: z
    .number()
    .positive()
    .default(1)
    .describe("first retry wait; doubles each retry (capped at 30 s), with jitter"),
  timeout_s: z
    .number()
    .positive()
    .default(60)
    .describe("seconds to wait to connect, for an answer, or between body bytes"),
  keep_parts: z
    .boolean()
    .default(false)
    .describe("keep index part_* files and archives after joining or extracting them"),
  keep_gz: z.boolean().default(false).describe("keep the .gz after unpacking the corpus"),
  dry_run: z.boolean().default(false).describe("list files and sizes, download nothing"),
  quiet: z.boolean().default(false).describe("no progress output"),
  progress_s: z
    .number()
    .positive()
    .default(10)
    .describe("seconds between progress lines when stderr is not a terminal"),
});

export type DownloadConfig = z.infer<typeof downloadSchema>;

export const downloadSpec: CommandConfigSpec<typeof downloadSchema> = {
  command: "download",
  schema: downloadSchema,
  env: { HF_ENDPOINT: "endpoint", HF_TOKEN: "token" },
};
