/**
 * Weights & Biases from `train` (trainer.logger with wandb), over the HTTP API that W&B's
 * own clients use (the Python SDK's internal_api.py and file_stream.py, wandb-core, and the
 * JavaScript SDK @wandb/sdk): GraphQL at `<WANDB_BASE_URL>/graphql` to find the key's entity
 * (`viewer`), create the run with its config (`upsertBucket`) and get upload URLs for files
 * (`createRunFiles`); the run's history, one JSON line per step, and its summary through
 * `POST <base>/files/<entity>/<project>/<run>/file_stream`, which is also told the files
 * uploaded and, at the end, `complete` with the exit code. Authentication is HTTP Basic
 * with user `api` and the API key as password, as theirs.
 *
 * Not @wandb/sdk itself: its one release (0.5.1, December 2024) throws from event handlers
 * when the server is unreachable (an uncaught exception would kill a training run), drops
 * everything in offline mode, and cannot upload files.
 *
 * Sending never holds up a step: lines queue and go out one request at a time in the
 * background; a request that fails for a reason that may pass (no connection, 429, 5xx) is
 * retried, and lines that still fail wait for the next step's request (each line keeps its
 * offset, so the history stays in order and whole). Starting the run is different: a missing
 * or refused key, or a server that cannot be reached, stops `train` before it starts anything.
 */
import { createHash, randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { ServiceError, UsageError } from "../runtime/errors.js";

export const DEFAULT_WANDB_BASE_URL = "https://api.wandb.ai";

export interface WandbSettings {
  apiKey: string;
  /** WANDB_BASE_URL without a trailing slash. */
  baseUrl: string;
  /** WANDB_ENTITY; null: the key's default entity (the viewer's). */
  entity: string | null;
  /** WANDB_RUN_ID: continue that run; null: a new run id. */
  runId: string | null;
}

/**
 * What the environment says about W&B, for a run whose trainer.logger has wandb: null when
 * WANDB_MODE=disabled (W&B's switch for turning every call into nothing); a UsageError naming
 * the variable when the key is missing, the mode is offline (not written here: see the
 * message) or a value is malformed.
 */
export function wandbSettings(
  env: Readonly<Record<string, string | undefined>>,
): WandbSettings | null {
  const mode = env.WANDB_MODE?.trim() || "online";
  if (mode === "disabled") return null;
  if (mode === "offline" || mode === "dryrun") {
    throw new UsageError(
      `WANDB_MODE=${mode}: searchr1 train logs to W&B online only; it does not write W&B's offline ` +
        "run files (the protobuf records `wandb sync` uploads). metrics.jsonl has every step; for " +
        "an upload later, add tensorboard to trainer.logger and upload <run folder>/tensorboard " +
        "with W&B's `wandb sync --sync-tensorboard`. Unset WANDB_MODE (or set it to online or " +
        "disabled), or drop wandb from trainer.logger",
    );
  }
  if (mode !== "online" && mode !== "run") {
    throw new UsageError(`WANDB_MODE=${mode}: expected online, disabled (or offline, refused)`);
  }
  const apiKey = env.WANDB_API_KEY?.trim();
  if (!apiKey) {
    throw new UsageError(
      "trainer.logger has wandb but WANDB_API_KEY is not set: export your W&B API key (and " +
        `WANDB_BASE_URL for a server other than ${DEFAULT_WANDB_BASE_URL}), set ` +
        "WANDB_MODE=disabled, or drop wandb from trainer.logger",
    );
  }
  const base = env.WANDB_BASE_URL?.trim() || DEFAULT_WANDB_BASE_URL;
  let url: URL;
  try {
    url = new URL(base);
  } catch {
    throw new UsageError(`WANDB_BASE_URL=${base}: not a URL (e.g. ${DEFAULT_WANDB_BASE_URL})`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new UsageError(`WANDB_BASE_URL=${base}: not an http(s) URL`);
  }
  const runId = env.WANDB_RUN_ID?.trim() || null;
  if (runId !== null && /[/\\#?%:\s]/.test(runId)) {
    throw new UsageError(`WANDB_RUN_ID=${runId}: a run id cannot hold / \\ # ? % : or spaces`);
  }
  return {
    apiKey,
    baseUrl: base.replace(/\/+$/, ""),
    entity: env.WANDB_ENTITY?.trim() || null,
    runId,
  };
}

/** A new run id as W&B makes them: 8 characters of [a-z0-9]. */
export function newRunId(): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  return [...randomBytes(8)].map((b) => alphabet[b % alphabet.length]).join("");
}

/** W&B's run config: each top-level key as `{value, desc}`. */
export function wandbConfig(config: Readonly<Record<string, unknown>>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(config).map(([k, value]) => [k, { desc: null, value }]));
}

/** One history line: the row's finite numbers, `_step`, `_runtime`, `_timestamp`, and media. */
export function historyLine(
  row: Readonly<Record<string, unknown>> & { step: number },
  runtimeS: number,
  timestamp: number,
  media: Readonly<Record<string, unknown>> = {},
): Record<string, unknown> {
  const values = Object.entries(row).filter(
    ([k, v]) => k !== "step" && typeof v === "number" && Number.isFinite(v),
  );
  return {
    ...Object.fromEntries(values),
    ...media,
    _step: row.step,
    _runtime: runtimeS,
    _timestamp: timestamp,
  };
}

/** Width and height of a PNG, from its IHDR chunk. */
export function pngSize(png: Uint8Array): { width: number; height: number } {
  const b = Buffer.from(png.buffer, png.byteOffset, png.byteLength);
  if (b.length < 24 || b.toString("latin1", 12, 16) !== "IHDR") throw new Error("not a PNG");
  return { width: b.readUInt32BE(16), height: b.readUInt32BE(20) };
}

/** An image for the history: W&B's `image-file` entry and the file it points at. */
export interface WandbImage {
  /** History key, e.g. `plots/reward`. */
  key: string;
  png: Uint8Array;
}

interface RunFile {
  name: string;
  bytes: Uint8Array;
}

export interface WandbRunOptions {
  project: string;
  /** The run's display name. */
  name: string;
  config: Readonly<Record<string, unknown>>;
  /** Lines for the user: the run's URL, and what went wrong with sending. */
  log: (line: string) => void;
  /** Waits before the retries of a request that failed for a reason that may pass. */
  retryDelaysMs?: readonly number[];
  /** Milliseconds one request may take. */
  timeoutMs?: number;
}

class TransientError extends Error {}

export class WandbRun {
  private offset: number;
  private readonly summary: Record<string, unknown> = {};
  /** History lines not yet taken by the server, and files not yet uploaded. */
  private backlog: Record<string, unknown>[] = [];
  private toUpload: RunFile[] = [];
  private uploaded: string[] = [];
  private chain: Promise<void> = Promise.resolve();
  private failing = false;
  private readonly started = Date.now();
  private readonly fileStream: string;

  private constructor(
    private readonly settings: WandbSettings,
    private readonly options: WandbRunOptions,
    private readonly client: GraphQl,
    readonly entity: string,
    readonly project: string,
    readonly runId: string,
    historyLineCount: number,
  ) {
    this.offset = historyLineCount;
    const path = [entity, project, runId].map(encodeURIComponent).join("/");
    this.fileStream = `${settings.baseUrl}/files/${path}/file_stream`;
  }

  /** Creates (or, with WANDB_RUN_ID, continues) the run; a refusal stops here, naming why. */
  static async start(settings: WandbSettings, options: WandbRunOptions): Promise<WandbRun> {
    const client = new GraphQl(settings, options.timeoutMs ?? 30_000);
    try {
      let entity = settings.entity;
      if (entity === null) {
        const data = (await client.request("viewer", VIEWER, {})) as {
          viewer?: { entity?: string | null } | null;
        };
        entity = data.viewer?.entity ?? null;
        if (!entity) {
          throw new UsageError(
            `${settings.baseUrl}/graphql knows no user for WANDB_API_KEY (no viewer): check the key`,
          );
        }
      }
      const runId = settings.runId ?? newRunId();
      const data = (await client.request("upsertBucket", UPSERT_BUCKET, {
        name: runId,
        project: options.project,
        entity,
        displayName: options.name,
        config: JSON.stringify(wandbConfig(options.config)),
        host: hostname(),
      })) as {
        upsertBucket?: {
          bucket?: {
            name?: string;
            historyLineCount?: number | null;
            project?: { name?: string; entity?: { name?: string } };
          };
        };
      };
      const bucket = data.upsertBucket?.bucket;
      if (!bucket?.name) {
        throw new ServiceError(`${settings.baseUrl}/graphql: upsertBucket gave no run`);
      }
      const run = new WandbRun(
        settings,
        options,
        client,
        bucket.project?.entity?.name ?? entity,
        bucket.project?.name ?? options.project,
        bucket.name,
        bucket.historyLineCount ?? 0,
      );
      options.log(`W&B run ${run.url()}`);
      return run;
    } catch (err) {
      // A server that cannot be reached at the start stops the run too, before it starts.
      throw err instanceof TransientError ? new ServiceError(`W&B: ${err.message}`) : err;
    }
  }

  /** The run's page: the API host's `api.` dropped, as W&B's clients print it. */
  url(): string {
    const app = this.settings.baseUrl.replace("://api.", "://");
    return `${app}/${this.entity}/${this.project}/runs/${this.runId}`;
  }

  /** Queues a step's history line (and its images); sent in the background, in order. */
  log(
    row: Readonly<Record<string, unknown>> & { step: number },
    images: readonly WandbImage[] = [],
  ): void {
    const media: Record<string, unknown> = {};
    const files: RunFile[] = [];
    for (const image of images) {
      const sha256 = createHash("sha256").update(image.png).digest("hex");
      const name = `media/images/${image.key}_${row.step}_${sha256.slice(0, 20)}.png`;
      media[image.key] = {
        _type: "image-file",
        format: "png",
        path: name,
        sha256,
        size: image.png.byteLength,
        ...pngSize(image.png),
      };
      files.push({ name, bytes: image.png });
    }
    const line = historyLine(row, (Date.now() - this.started) / 1000, Date.now() / 1000, media);
    this.chain = this.chain.then(() => this.send({ line, files }));
  }

  /**
   * Sends what is queued, then marks the run complete with `exitCode` (0: finished, else
   * failed), giving up after `deadlineMs` so that an unreachable server does not hold the
   * process; what could not be sent is said in one line (metrics.jsonl has it all).
   */
  async finish(exitCode: number, deadlineMs = 60_000): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<"late">((resolve) => {
      timer = setTimeout(() => resolve("late"), deadlineMs);
    });
    const work = (async () => {
      await this.chain;
      if (this.backlog.length > 0) await this.flush();
      if (this.backlog.length === 0) {
        await this.post({ complete: true, exitcode: exitCode });
      }
    })();
    try {
      const outcome = await Promise.race([work.then(() => "done" as const), deadline]);
      if (outcome === "late" || this.backlog.length > 0) {
        this.options.log(
          `warning: W&B: ${this.backlog.length} step(s) not sent to ${this.url()} ` +
            `(${outcome === "late" ? `still sending after ${deadlineMs / 1000} s` : "the server did not take them"}); metrics.jsonl has every step`,
        );
      }
    } catch (err) {
      this.options.log(`warning: W&B: could not close ${this.url()}: ${(err as Error).message}`);
    } finally {
      clearTimeout(timer);
    }
  }

  private async send(pending: { line: Record<string, unknown>; files: RunFile[] }): Promise<void> {
    this.backlog.push(pending.line);
    this.toUpload.push(...pending.files);
    await this.flush();
  }

  /** Uploads the backlog's files, then posts its lines; on failure they wait for the next. */
  private async flush(): Promise<void> {
    try {
      if (this.toUpload.length > 0) await this.upload();
      const lines = this.backlog;
      for (const line of lines) Object.assign(this.summary, line);
      await this.post({
        files: {
          "wandb-history.jsonl": {
            offset: this.offset,
            content: lines.map((l) => JSON.stringify(l)),
          },
          "wandb-summary.json": { offset: 0, content: [JSON.stringify(this.summary)] },
        },
        ...(this.uploaded.length > 0 ? { uploaded: this.uploaded } : {}),
      });
      this.offset += lines.length;
      this.backlog = [];
      this.uploaded = [];
      if (this.failing) this.options.log("W&B: sending again");
      this.failing = false;
    } catch (err) {
      if (!this.failing) {
        this.options.log(
          `warning: W&B: ${(err as Error).message}; the steps wait and go with the next one`,
        );
      }
      this.failing = true;
    }
  }

  /** Uploads toUpload (each file leaves it once the server has it). */
  private async upload(): Promise<void> {
    const files = [...this.toUpload];
    const data = (await this.retrying(() =>
      this.client.request("createRunFiles", CREATE_RUN_FILES, {
        entity: this.entity,
        project: this.project,
        run: this.runId,
        files: files.map((f) => f.name),
      }),
    )) as {
      createRunFiles?: {
        uploadHeaders?: string[] | null;
        files?: { name: string; uploadUrl: string }[];
      };
    };
    const urls = new Map((data.createRunFiles?.files ?? []).map((f) => [f.name, f.uploadUrl]));
    const headers = Object.fromEntries(
      (data.createRunFiles?.uploadHeaders ?? []).flatMap((h) => {
        const i = h.indexOf(":");
        return i > 0 ? [[h.slice(0, i).trim(), h.slice(i + 1).trim()]] : [];
      }),
    );
    for (const file of files) {
      const url = urls.get(file.name);
      if (!url) throw new Error(`createRunFiles gave no upload URL for ${file.name}`);
      await this.retrying(async () => {
        const response = await fetchOrTransient(url, {
          method: "PUT",
          headers,
          body: Buffer.from(file.bytes) as unknown as BodyInit,
          signal: AbortSignal.timeout(this.options.timeoutMs ?? 30_000),
        });
        await checkStatus(response, `upload of ${file.name}`);
      });
      this.uploaded.push(file.name);
      this.toUpload = this.toUpload.filter((f) => f !== file);
    }
  }

  private async post(body: unknown): Promise<void> {
    await this.retrying(async () => {
      const response = await fetchOrTransient(this.fileStream, {
        method: "POST",
        headers: { ...authHeaders(this.settings), "content-type": "application/json" },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(this.options.timeoutMs ?? 30_000),
      });
      await checkStatus(response, "file_stream");
    });
  }

  private async retrying<T>(work: () => Promise<T>): Promise<T> {
    const delays = this.options.retryDelaysMs ?? [1000, 4000];
    for (let attempt = 0; ; attempt++) {
      try {
        return await work();
      } catch (err) {
        const delay = delays[attempt];
        if (!(err instanceof TransientError) || delay === undefined) throw err;
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  }
}

function authHeaders(settings: WandbSettings): Record<string, string> {
  return {
    authorization: `Basic ${Buffer.from(`api:${settings.apiKey}`).toString("base64")}`,
    "user-agent": "searchr1",
  };
}

async function fetchOrTransient(url: string, init: RequestInit): Promise<Response> {
  try {
    return await fetch(url, init);
  } catch (err) {
    const cause = (err as { cause?: { code?: string; message?: string } }).cause;
    throw new TransientError(`${url}: ${cause?.code ?? cause?.message ?? (err as Error).message}`);
  }
}

/** A 2xx passes; 429 and 5xx are worth retrying; anything else is final. */
async function checkStatus(response: Response, what: string): Promise<void> {
  if (response.ok) return;
  const text = (await response.text().catch(() => "")).trim().slice(0, 300);
  const message = `${what} answered ${response.status}${text ? `: ${text}` : ""}`;
  if (response.status === 429 || response.status >= 500) throw new TransientError(message);
  throw new Error(message);
}

class GraphQl {
  private readonly url: string;

  constructor(
    private readonly settings: WandbSettings,
    private readonly timeoutMs: number,
  ) {
    this.url = `${settings.baseUrl}/graphql`;
  }

  /** The `data` of a query; errors name the operation and say what the server said. */
  async request(op: string, query: string, variables: Record<string, unknown>): Promise<unknown> {
    let response: Response;
    try {
      response = await fetch(this.url, {
        method: "POST",
        headers: { ...authHeaders(this.settings), "content-type": "application/json" },
        body: JSON.stringify({ query, variables }),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (err) {
      const cause = (err as { cause?: { code?: string; message?: string } }).cause;
      throw new TransientError(
        `${this.url} (${op}): ${cause?.code ?? cause?.message ?? (err as Error).message}` +
          " (WANDB_BASE_URL: is the server reachable?)",
      );
    }
    if (response.status === 401 || response.status === 403) {
      throw new UsageError(
        `${this.url} refused WANDB_API_KEY (${response.status} on ${op}): check the key` +
          (this.settings.baseUrl === DEFAULT_WANDB_BASE_URL
            ? ""
            : ` and that it belongs to ${this.settings.baseUrl} (WANDB_BASE_URL)`),
      );
    }
    await checkStatus(response, `${this.url} (${op})`);
    const body = (await response.json().catch(() => null)) as {
      data?: unknown;
      errors?: { message?: string }[];
    } | null;
    if (body === null) throw new ServiceError(`${this.url} (${op}): the answer is not JSON`);
    if (body.errors?.length) {
      throw new ServiceError(
        `${this.url} (${op}): ${body.errors.map((e) => e.message ?? "error").join("; ")}`,
      );
    }
    return body.data ?? {};
  }
}

const VIEWER = `query Viewer {
  viewer {
    id
    entity
  }
}`;

const UPSERT_BUCKET = `mutation UpsertBucket(
  $name: String
  $project: String
  $entity: String
  $displayName: String
  $config: JSONString
  $host: String
) {
  upsertBucket(
    input: {
      name: $name
      modelName: $project
      entityName: $entity
      displayName: $displayName
      config: $config
      host: $host
    }
  ) {
    bucket {
      id
      name
      displayName
      historyLineCount
      project {
        name
        entity {
          name
        }
      }
    }
    inserted
  }
}`;

const CREATE_RUN_FILES = `mutation CreateRunFiles($entity: String!, $project: String!, $run: String!, $files: [String!]!) {
  createRunFiles(input: { entityName: $entity, projectName: $project, runName: $run, files: $files }) {
    runID
    uploadHeaders
    files {
      name
      uploadUrl
    }
  }
}`;
