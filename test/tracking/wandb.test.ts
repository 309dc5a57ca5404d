// The W&B client of `train` (src/tracking/wandb.ts) against a stand-in server that records what
// arrives (test/helpers/wandb-server.ts); `train` end to end with it is in train.test.ts.
import { createHash } from "node:crypto";
import { afterEach, describe, expect, it } from "vitest";
import { CliError } from "../../src/runtime/errors.js";
import {
  DEFAULT_WANDB_BASE_URL,
  historyLine,
  newRunId,
  pngSize,
  WandbRun,
  wandbConfig,
  wandbSettings,
} from "../../src/tracking/wandb.js";
import { startWandbStandIn, type WandbStandIn } from "../helpers/wandb-server.js";

const KEY = "0123456789abcdef0123456789abcdef01234567";
const BASIC = `Basic ${Buffer.from(`api:${KEY}`).toString("base64")}`;

/** The first bytes of a PNG: signature and IHDR (what pngSize and W&B's entry read). */
function fakePng(width: number, height: number, fill = 0): Buffer {
  const b = Buffer.alloc(64, fill);
  Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]).copy(b, 0);
  b.writeUInt32BE(13, 8);
  b.write("IHDR", 12, "latin1");
  b.writeUInt32BE(width, 16);
  b.writeUInt32BE(height, 20);
  return b;
}

const refusal = (env: Record<string, string>) => {
  try {
    wandbSettings(env);
  } catch (err) {
    expect(err).toBeInstanceOf(CliError);
    expect((err as CliError).exitCode).toBe(2);
    return (err as Error).message;
  }
  throw new Error("not refused");
};

describe("wandbSettings", () => {
  it("reads the key, WANDB_BASE_URL (default api.wandb.ai), WANDB_ENTITY and WANDB_RUN_ID", () => {
    expect(wandbSettings({ WANDB_API_KEY: KEY })).toEqual({
      apiKey: KEY,
      baseUrl: DEFAULT_WANDB_BASE_URL,
      entity: null,
      runId: null,
    });
    expect(DEFAULT_WANDB_BASE_URL).toBe("https://api.wandb.ai");
    expect(
      wandbSettings({
        WANDB_API_KEY: KEY,
        WANDB_BASE_URL: "http://wandb.local:8080/",
        WANDB_ENTITY: "team",
        WANDB_RUN_ID: "abc123",
        WANDB_MODE: "online",
      }),
    ).toEqual({ apiKey: KEY, baseUrl: "http://wandb.local:8080", entity: "team", runId: "abc123" });
  });

  it("WANDB_MODE=disabled turns W&B off", () => {
    expect(wandbSettings({ WANDB_MODE: "disabled" })).toBeNull();
  });

  it("refuses, naming the variable: no key, offline mode, a bad URL, mode or run id", () => {
    expect(refusal({})).toMatch(/^trainer\.logger has wandb but WANDB_API_KEY is not set/);
    expect(refusal({ WANDB_API_KEY: " " })).toMatch(/WANDB_API_KEY is not set/);
    const offline = refusal({ WANDB_API_KEY: KEY, WANDB_MODE: "offline" });
    expect(offline).toMatch(/^WANDB_MODE=offline: searchr1 train logs to W&B online only/);
    expect(offline).toMatch(/wandb sync --sync-tensorboard/);
    expect(refusal({ WANDB_API_KEY: KEY, WANDB_MODE: "dryrun" })).toMatch(/^WANDB_MODE=dryrun/);
    expect(refusal({ WANDB_API_KEY: KEY, WANDB_MODE: "sometimes" })).toMatch(
      /^WANDB_MODE=sometimes: expected online, disabled/,
    );
    expect(refusal({ WANDB_API_KEY: KEY, WANDB_BASE_URL: "not a url" })).toMatch(
      /^WANDB_BASE_URL=not a url: not a URL/,
    );
    expect(refusal({ WANDB_API_KEY: KEY, WANDB_BASE_URL: "ftp://x" })).toMatch(/not an http/);
    expect(refusal({ WANDB_API_KEY: KEY, WANDB_RUN_ID: "a/b" })).toMatch(/^WANDB_RUN_ID=a\/b/);
  });
});

describe("the pieces", () => {
  it("run ids, config, history lines, PNG sizes", () => {
    expect(newRunId()).toMatch(/^[a-z0-9]{8}$/);
    expect(wandbConfig({ actor: { lr: 1e-6 }, model: { path: "m" } })).toEqual({
      actor: { desc: null, value: { lr: 1e-6 } },
      model: { desc: null, value: { path: "m" } },
    });
    expect(
      historyLine(
        { step: 3, epoch: 0, a: 1, b: null, c: Number.NaN, d: Number.POSITIVE_INFINITY },
        2.5,
        1e9,
        {
          img: { _type: "image-file" },
        },
      ),
    ).toEqual({
      epoch: 0,
      a: 1,
      img: { _type: "image-file" },
      _step: 3,
      _runtime: 2.5,
      _timestamp: 1e9,
    });
    expect(pngSize(fakePng(1280, 720))).toEqual({ width: 1280, height: 720 });
    expect(() => pngSize(Buffer.from("not a png at all, not at all, really not"))).toThrow(/PNG/);
  });
});

describe("WandbRun against a stand-in server", () => {
  let server: WandbStandIn;
  afterEach(async () => {
    await server?.close();
  });

  const settings = (extra: Partial<ReturnType<typeof wandbSettings>> = {}) => ({
    apiKey: KEY,
    baseUrl: server.url,
    entity: null,
    runId: null,
    ...extra,
  });

  it("creates the run with its config, streams every step's metrics and images, completes", async () => {
    server = await startWandbStandIn({ apiKey: KEY, entity: "alice" });
    const lines: string[] = [];
    const config = { trainer: { project_name: "proj", experiment_name: "exp" }, rollout: { n: 5 } };
    const run = await WandbRun.start(settings(), {
      project: "proj",
      name: "exp",
      config,
      log: (l) => lines.push(l),
    });
    expect(run.entity).toBe("alice");
    expect(run.runId).toMatch(/^[a-z0-9]{8}$/);
    expect(lines).toEqual([`W&B run ${server.url}/alice/proj/runs/${run.runId}`]);
    const [viewer, upsert] = server.graphql;
    expect(viewer?.query).toMatch(/viewer/);
    expect(upsert?.query).toMatch(/upsertBucket/);
    expect(upsert?.variables).toMatchObject({
      name: run.runId,
      project: "proj",
      entity: "alice",
      displayName: "exp",
    });
    expect(JSON.parse(upsert?.variables.config as string)).toEqual(wandbConfig(config));
    for (const call of server.graphql) expect(call.authorization).toBe(BASIC);

    const png = fakePng(1280, 900, 7);
    run.log({ step: 0, "val/em/mean": 0.25 });
    run.log({
      step: 1,
      "reward/mean": 0.5,
      "actor/kl_loss": null,
      "rollout/logprob_gap": Number.NaN,
    });
    run.log({ step: 2, "reward/mean": 0.75 }, [{ key: "plots/reward", png }]);
    await run.finish(0);

    const history = server.history();
    expect(history.map((h) => h._step)).toEqual([0, 1, 2]);
    expect(history[0]).toMatchObject({ "val/em/mean": 0.25 });
    expect(history[1]).toMatchObject({ "reward/mean": 0.5 });
    expect(history[1]).not.toHaveProperty("actor/kl_loss");
    expect(history[1]).not.toHaveProperty("rollout/logprob_gap");
    for (const h of history) {
      expect(typeof h._runtime).toBe("number");
      expect(Math.abs((h._timestamp as number) - Date.now() / 1000)).toBeLessThan(60);
    }
    const sha256 = createHash("sha256").update(png).digest("hex");
    const name = `media/images/plots/reward_2_${sha256.slice(0, 20)}.png`;
    expect(history[2]?.["plots/reward"]).toEqual({
      _type: "image-file",
      format: "png",
      path: name,
      sha256,
      size: png.length,
      width: 1280,
      height: 900,
    });
    expect(server.uploads.get(name)).toEqual({ bytes: png, header: "yes" });
    const createFiles = server.graphql.find((c) => /createRunFiles/.test(c.query));
    expect(createFiles?.variables).toEqual({
      entity: "alice",
      project: "proj",
      run: run.runId,
      files: [name],
    });
    // The post that carries the image's line tells the server the file is uploaded.
    const withImage = server.fileStream.find((p) =>
      p.body.files?.["wandb-history.jsonl"]?.content.some((l) => l.includes(name)),
    );
    expect(withImage?.body.uploaded).toEqual([name]);
    // Offsets follow the lines; the summary is the latest value of everything.
    const posts = server.fileStream.filter((p) => p.body.files);
    expect(posts.map((p) => p.body.files?.["wandb-history.jsonl"]?.offset)).toEqual([0, 1, 2]);
    const summary = JSON.parse(posts.at(-1)?.body.files?.["wandb-summary.json"]?.content[0] ?? "");
    expect(summary).toMatchObject({ "val/em/mean": 0.25, "reward/mean": 0.75, _step: 2 });
    expect(server.fileStream.at(-1)?.body).toEqual({ complete: true, exitcode: 0 });
    for (const post of server.fileStream) {
      expect(post.path).toBe(`/files/alice/proj/${run.runId}/file_stream`);
      expect(post.authorization).toBe(BASIC);
    }
  });

  it("retries a failed post, and lines that still fail go with the next one, in order", async () => {
    server = await startWandbStandIn({ apiKey: KEY });
    const lines: string[] = [];
    const run = await WandbRun.start(settings({ entity: "team", runId: "fixed-id" }), {
      project: "p",
      name: "n",
      config: {},
      log: (l) => lines.push(l),
      retryDelaysMs: [1, 1],
    });
    // WANDB_ENTITY given: no viewer query; WANDB_RUN_ID: that run
    expect(server.graphql.map((c) => /viewer/.test(c.query))).toEqual([false]);
    expect(run.runId).toBe("fixed-id");
    server.failFileStream(2); // step 1's first two tries fail, the third (a retry) passes
    run.log({ step: 1, x: 1 });
    await run.finish(0);
    expect(server.history()).toEqual([expect.objectContaining({ _step: 1, x: 1 })]);
    expect(lines.filter((l) => l.startsWith("warning:"))).toEqual([]);
    server.failFileStream(3); // every try of step 2 fails: it waits for step 3's post
    const again = await WandbRun.start(settings({ entity: "team", runId: "other" }), {
      project: "p",
      name: "n",
      config: {},
      log: (l) => lines.push(l),
      retryDelaysMs: [1, 1],
    });
    again.log({ step: 2, x: 2 });
    again.log({ step: 3, x: 3 });
    await again.finish(1);
    const posts = server.fileStream.filter((p) => p.path.includes("/other/"));
    expect(posts.map((p) => p.body.files?.["wandb-history.jsonl"]?.offset)).toEqual([0, undefined]);
    expect(
      posts[0]?.body.files?.["wandb-history.jsonl"]?.content.map((l) => JSON.parse(l).x),
    ).toEqual([2, 3]);
    expect(posts[1]?.body).toEqual({ complete: true, exitcode: 1 });
    expect(lines.filter((l) => l.startsWith("warning: W&B:"))).toEqual([
      'warning: W&B: file_stream answered 500: {"error":"try again"}; the steps wait and go with the next one',
    ]);
    expect(lines).toContain("W&B: sending again");
  });

  it("a run resumed under WANDB_RUN_ID continues the history at the server's line count", async () => {
    server = await startWandbStandIn({ apiKey: KEY, historyLineCount: 7 });
    const run = await WandbRun.start(settings({ runId: "resumed" }), {
      project: "p",
      name: "n",
      config: {},
      log: () => {},
    });
    run.log({ step: 8, x: 1 });
    await run.finish(0);
    expect(server.fileStream[0]?.body.files?.["wandb-history.jsonl"]?.offset).toBe(7);
  });

  it("a refused key or an unreachable server stops the start, naming why", async () => {
    server = await startWandbStandIn({ apiKey: KEY });
    const start = (s: ReturnType<typeof settings>) =>
      WandbRun.start(s, { project: "p", name: "n", config: {}, log: () => {} });
    await expect(start(settings({ apiKey: "wrong" }))).rejects.toThrow(
      new RegExp(`^${server.url}/graphql refused WANDB_API_KEY \\(401 on viewer\\): check the key`),
    );
    await expect(start(settings({ apiKey: "wrong" }))).rejects.toMatchObject({ exitCode: 2 });
    const gone = await startWandbStandIn();
    await gone.close(); // a port nothing listens on
    await expect(start({ ...settings(), baseUrl: gone.url })).rejects.toThrow(
      /^W&B: http:\/\/127\.0\.0\.1:\d+\/graphql \(viewer\): ECONNREFUSED \(WANDB_BASE_URL: is the server reachable\?\)/,
    );
  });

  it("gives up at the deadline when the server never answers, and says so", async () => {
    server = await startWandbStandIn({ apiKey: KEY });
    const lines: string[] = [];
    const run = await WandbRun.start(settings(), {
      project: "p",
      name: "n",
      config: {},
      log: (l) => lines.push(l),
      retryDelaysMs: [1],
    });
    server.failFileStream(1000);
    run.log({ step: 1, x: 1 });
    await run.finish(0, 2000);
    expect(lines.at(-1)).toMatch(
      /^warning: W&B: 1 step\(s\) not sent to .* \(the server did not take them\); metrics\.jsonl has every step$/,
    );
  });
});
