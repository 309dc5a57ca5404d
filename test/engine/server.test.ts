import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCli, startCli } from "../helpers/cli.js";
import { expectJsonError } from "../helpers/http.js";
import {
  ENGINE_ARGS,
  GREEDY,
  type GreedyCase,
  generate,
  generateOk,
  greedy,
  modelDir,
  type Output,
  type Reply,
  type RunningEngine,
  request,
  sleep,
  startEngine,
} from "./helpers.js";

/**
 * serve-engine as a server: its routes, every bad request answered 4xx naming the field
 * (and the server still serving), clients that go away, weight updates, a KV cache too
 * small for the load, start-up and shutdown, and the engine process dying. Real engine
 * processes on the fixture models, real sockets.
 */

const QWEN = modelDir("qwen-bpe");
const cases = greedy().cases.filter((c) => c.model === "qwen-bpe");
const byName = (name: string) => cases.find((c) => c.name === name) as GreedyCase;
/** A job that keeps the engine busy for a while (16 × 480 tokens). */
const LONG = {
  input_ids: [5, 6, 7, 8, 9],
  sampling_params: { max_new_tokens: 480, n: 16, ignore_eos: true, seed: 1 },
};

let dir: string;
let server: RunningEngine;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "sr1-engine-"));
  server = await startEngine(["--model", QWEN, "--max-body-mb", "1"]);
}, 60_000);

afterAll(async () => {
  if (server) expect((await server.stop()).code).toBe(0);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

// biome-ignore lint/suspicious/noExplicitAny: test code reads arbitrary JSON answers
async function serverInfo(base: string): Promise<any> {
  const r = await request(base, "GET", "/get_server_info");
  expect(r.status).toBe(200);
  return r.json;
}

/** Polls until `ok(server info)` or fails after `ms`. */
// biome-ignore lint/suspicious/noExplicitAny: server info JSON
async function waitFor(base: string, ok: (info: any) => boolean, what: string, ms = 20_000) {
  const end = Date.now() + ms;
  for (;;) {
    const info = await serverInfo(base);
    if (ok(info)) return info;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(info)}`);
    await sleep(20);
  }
}

/** A POST /generate whose client can be cut off. */
function startRequest(
  base: string,
  body: unknown,
): { req: http.ClientRequest; reply: Promise<Reply> } {
  const text = JSON.stringify(body);
  let req!: http.ClientRequest;
  const reply = new Promise<Reply>((resolve, reject) => {
    req = http.request(
      new URL("/generate", base),
      { method: "POST", headers: { "Content-Length": Buffer.byteLength(text) } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("error", reject);
        res.on("end", () => {
          const t = Buffer.concat(chunks).toString("utf8");
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            text: t,
            json: JSON.parse(t),
          });
        });
      },
    );
    req.on("error", reject);
    req.end(text);
  });
  return { req, reply };
}

async function expectAlive(base = server.base): Promise<void> {
  const c = byName("len5");
  const out = await generateOk<Output>(base, { input_ids: c.prompt_ids, sampling_params: GREEDY });
  expect(out.output_ids).toEqual(c.output_ids);
}

describe("routes", () => {
  it("GET /health: 200 when ready, with the weight version", async () => {
    const r = await request(server.base, "GET", "/health");
    expect(r.status).toBe(200);
    expect(r.json).toEqual({ status: "ok", ready: true, model_path: QWEN, weight_version: "0" });
  });

  it("GET /get_model_info and /get_weight_version", async () => {
    const r = await request(server.base, "GET", "/get_model_info");
    expect(r.status).toBe(200);
    expect(r.json).toEqual({
      model_path: QWEN,
      tokenizer_path: join(QWEN, "tokenizer.json"),
      is_generation: true,
      vocab_size: 451,
      context_length: 512,
      eos_token_ids: [450, 448],
      weight_version: "0",
    });
    const v = await request(server.base, "GET", "/get_weight_version");
    expect(v.json).toEqual({ weight_version: "0" });
  });

  it("GET /get_server_info: KV blocks, queue, prefix-cache hit rate, tokens/s", async () => {
    await expectAlive();
    const info = await serverInfo(server.base);
    expect(info).toMatchObject({
      engine: "searchr1-engine",
      model_path: QWEN,
      device: "cpu",
      context_length: 512,
      block_size: 16,
      skip_tokenizer_init: false,
      enforce_eager: false,
      cuda_graphs: false, // the CPU records no graphs
      max_running: 256,
      running_requests: 0,
      queued_requests: 0,
      kv_blocks_used: 0,
      weight_version: "0",
    });
    expect(info.kv_blocks_total).toBe(info.kv_blocks);
    expect(info.kv_blocks_free).toBe(info.kv_blocks_total);
    expect(info.generated_tokens).toBeGreaterThanOrEqual(24);
    expect(info.tokens_per_second).toBeGreaterThan(0);
    expect(typeof info.prefix_cache_hit_rate).toBe("number");
    expect(info.internal_states[0].kv_blocks_total).toBe(info.kv_blocks_total);
  });

  it("GET /metrics: Prometheus text with the same figures", async () => {
    const r = await request(server.base, "GET", "/metrics");
    expect(r.status).toBe(200);
    expect(r.headers["content-type"]).toBe("text/plain; version=0.0.4; charset=utf-8");
    const info = await serverInfo(server.base);
    const value = (name: string) => {
      const m = new RegExp(`^searchr1_engine_${name}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(r.text);
      return m ? Number(m[1]) : Number.NaN;
    };
    expect(value("kv_blocks_total")).toBe(info.kv_blocks_total);
    expect(value("running_requests")).toBe(0);
    expect(value("generated_tokens_total")).toBeGreaterThanOrEqual(24);
    expect(r.text).toContain("# TYPE searchr1_engine_generated_tokens_total counter");
    expect(r.text).toContain('searchr1_engine_weight_version{version="0"} 1');
    expect(r.text).toMatch(/^searchr1_engine_generate_requests_total\{code="2xx"\} [1-9]/m);
    for (const line of r.text.trim().split("\n")) {
      expect(line).toMatch(/^(# (HELP|TYPE) \w+ .+|\w+(\{\w+="[^"]*"\})? -?[\d.e+-]+)$/);
    }
  });

  it("GET and POST /flush_cache flush when idle, 400 while sequences are live", async () => {
    for (const method of ["GET", "POST"]) {
      const r = await request(server.base, method, "/flush_cache");
      expect(r.status).toBe(200);
      expect(r.json).toEqual({ success: true, message: "cache flushed" });
    }
    const job = startRequest(server.base, LONG);
    await waitFor(server.base, (i) => i.running_requests > 0, "the job to run");
    const busy = await request(server.base, "POST", "/flush_cache");
    expect(busy.status).toBe(400);
    expect(busy.json.success).toBe(false);
    expect(busy.json.error).toContain("cache not flushed");
    job.req.destroy();
    await job.reply.catch(() => {});
    await waitFor(server.base, (i) => i.running_requests + i.queued_requests === 0, "the abort");
  });

  it("release/resume_memory_occupation give the KV cache back and take it again; generation waits for it", async () => {
    const c = byName("len1");
    const body = JSON.stringify({ input_ids: c.prompt_ids, sampling_params: GREEDY });
    const before = await request(server.base, "POST", "/generate", body);
    expect(before.status).toBe(200);
    const blocks = (await serverInfo(server.base)).kv_blocks_total;

    const released = await request(server.base, "POST", "/release_memory_occupation", "");
    expect(released.status).toBe(200);
    expect(released.json).toEqual({ success: true, message: "KV cache released" });
    expect(await serverInfo(server.base)).toMatchObject({ kv_released: true, kv_blocks_cached: 0 });
    // Generation is refused while released, naming why; the server goes on serving.
    const refused = await request(server.base, "POST", "/generate", body);
    expect(refused.status).toBe(400);
    expect(refused.json.error).toMatch(/the KV cache is released .*resume it first/);
    const again = await request(server.base, "POST", "/release_memory_occupation", "{}");
    expect(again.status).toBe(400);
    expect(again.json).toMatchObject({
      success: false,
      message: "the KV cache is already released",
    });
    // (Weights still load while released: train does so every step, test/train/train.test.ts.)
    const resumed = await request(
      server.base,
      "GET",
      "/resume_memory_occupation",
      JSON.stringify({ tags: ["kv_cache"] }),
    );
    expect(resumed.status).toBe(200);
    expect(resumed.json).toEqual({ success: true, message: "KV cache resumed" });
    expect(await serverInfo(server.base)).toMatchObject({
      kv_released: false,
      kv_blocks_total: blocks,
    });
    const after = await request(server.base, "POST", "/generate", body);
    expect(after.status).toBe(200);
    expect(after.json.output_ids).toEqual(before.json.output_ids);
    const notReleased = await request(server.base, "POST", "/resume_memory_occupation");
    expect(notReleased.status).toBe(400);
    expect(notReleased.json.message).toBe("the KV cache is not released");

    // Only the KV cache is released: other tags are refused, naming the field.
    const weights = await request(
      server.base,
      "POST",
      "/release_memory_occupation",
      JSON.stringify({ tags: ["weights", "kv_cache"] }),
    );
    expect(weights.status).toBe(400);
    expect(weights.json.error).toMatch(/"tags" = \["weights","kv_cache"\]: this engine releases/);
    // Not while sequences are live.
    const job = startRequest(server.base, LONG);
    await waitFor(server.base, (i) => i.running_requests > 0, "the job to run");
    const busy = await request(server.base, "POST", "/release_memory_occupation");
    expect(busy.status).toBe(400);
    expect(busy.json.message).toMatch(/requests are running or queued/);
    job.req.destroy();
    await job.reply.catch(() => {});
    await waitFor(server.base, (i) => i.running_requests + i.queued_requests === 0, "the abort");
    expect((await serverInfo(server.base)).kv_released).toBe(false);
  });

  it("404 names the routes; 405 says which methods (Allow)", async () => {
    const a = await request(server.base, "GET", "/generate_text");
    expect(a.status).toBe(404);
    expect(a.json.error).toContain("/generate");
    expect(a.json.error).toContain("/v1/chat/completions");
    // OpenAI's routes answer in OpenAI's error shape (test/engine/openai.test.ts).
    const v1 = await request(server.base, "GET", "/v1/completions");
    expect(v1.status).toBe(405);
    expect(v1.headers.allow).toBe("POST");
    expect(v1.json.error).toMatchObject({ type: "invalid_request_error", param: null });
    const b = await request(server.base, "GET", "/generate");
    expect(b.status).toBe(405);
    expect(b.headers.allow).toBe("POST, PUT");
    const c = await request(server.base, "POST", "/health", "{}");
    expect(c.status).toBe(405);
    expect(c.headers.allow).toBe("GET, HEAD");
    const d = await request(server.base, "GET", "/update_weights_from_disk");
    expect(d.headers.allow).toBe("POST");
  });

  it("PUT /generate works as POST does", async () => {
    const c = byName("len1");
    const r = await request(
      server.base,
      "PUT",
      "/generate",
      JSON.stringify({ input_ids: c.prompt_ids, sampling_params: GREEDY }),
    );
    expect(r.status).toBe(200);
    expect(r.json.output_ids).toEqual(c.output_ids);
  });
});

describe("bad requests: 4xx with a JSON error naming the field, and the server keeps serving", () => {
  async function expectError(reply: Promise<Reply>, status: number, mention: string) {
    const r = await expectJsonError(reply, status, mention);
    await expectAlive();
    return r;
  }

  it("400 on malformed JSON", async () => {
    await expectError(generate(server.base, '{"input_ids": [1, 2'), 400, "not valid JSON");
    await expectError(generate(server.base, ""), 400, "not valid JSON");
  });

  it.each([
    [[1, 2, 3], "JSON object"],
    [{ input_ids: [1, 451] }, '"input_ids[1]" must be a token id, an integer in [0, 451)'],
    [{ input_ids: [[1, 2], [-4]] }, '"input_ids[1][0]"'],
    [{ input_ids: new Array(512).fill(7) }, "context length of 512"],
    [{ input_ids: [1], sampling_params: { temprature: 0.5 } }, '"sampling_params.temprature"'],
    [
      { input_ids: [1], sampling_params: { max_new_tokens: -5 } },
      '"sampling_params.max_new_tokens"',
    ],
    [{ input_ids: [1], sampling_params: { top_p: "0.9" } }, '"sampling_params.top_p"'],
    [
      { input_ids: [1], sampling_params: { stop_token_ids: [999] } },
      '"sampling_params.stop_token_ids[0]"',
    ],
    [{ input_ids: [1], sampling_params: { n: -1 } }, '"sampling_params.n"'],
    [{ input_ids: [1], sampling_params: { seed: -7 } }, '"sampling_params.seed"'],
    [{ input_ids: [1], return_logprob: 1 }, '"return_logprob"'],
    [{ input_ids: [1], stream: true }, '"stream"'],
    [{ text: "hello" }, '"text"'],
  ])("400: %j", async (body, mention) => {
    await expectError(generate(server.base, body), 400, mention);
  });

  it("413 when the body passes --max-body-mb, on a connection that lives on", async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const big = JSON.stringify({ input_ids: new Array(600_000).fill(1) });
      await expectError(generate(server.base, big, { agent }), 413, "--max-body-mb");
      const c = byName("len1");
      const r = await generate(
        server.base,
        { input_ids: c.prompt_ids, sampling_params: GREEDY },
        { agent },
      );
      expect(r.json.output_ids).toEqual(c.output_ids);
    } finally {
      agent.destroy();
    }
  });

  it("bad update_weights_from_disk requests: 400 naming the field; weights unchanged", async () => {
    const post = (body: unknown) =>
      request(server.base, "POST", "/update_weights_from_disk", JSON.stringify(body));
    await expectError(post({}), 400, '"model_path" is required');
    await expectError(post({ model_path: join(dir, "nowhere") }), 400, '"model_path"');
    await expectError(
      post({ model_path: QWEN, abort_all_requests: "yes" }),
      400,
      '"abort_all_requests"',
    );
    await expectError(post({ model_path: QWEN, load_format: "pt" }), 400, '"load_format"');
    await expectError(post({ model_path: QWEN, wieght_version: "3" }), 400, '"wieght_version"');
    // Another architecture: the engine refuses and keeps the weights it has.
    const other = await expectError(
      post({ model_path: modelDir("llama-sp") }),
      400,
      "weights not updated",
    );
    expect(other.json.success).toBe(false);
    expect((await request(server.base, "GET", "/health")).json.weight_version).toBe("0");
  });

  it("many bad and good requests at once: each gets its own answer", async () => {
    const c = byName("len17");
    const replies = await Promise.all(
      Array.from({ length: 24 }, (_, i) =>
        i % 2
          ? generate(server.base, { input_ids: c.prompt_ids, sampling_params: GREEDY })
          : generate(server.base, { input_ids: [1, 2], sampling_params: { top_k: 0 } }),
      ),
    );
    replies.forEach((r, i) => {
      if (i % 2) expect(r.json.output_ids).toEqual(c.output_ids);
      else expect(r.json.error).toContain('"sampling_params.top_k"');
    });
  });
});

describe("clients that go away", () => {
  it("a client that disconnects aborts its sequences in the engine", async () => {
    const before = (await serverInfo(server.base)).generated_tokens;
    const job = startRequest(server.base, LONG);
    await waitFor(server.base, (i) => i.running_requests > 0, "the job to run");
    job.req.destroy();
    await expect(job.reply).rejects.toThrow();
    const idle = await waitFor(
      server.base,
      (i) => i.running_requests + i.queued_requests === 0,
      "the engine to drop the sequences",
      5_000,
    );
    const made = idle.generated_tokens - before;
    expect(made).toBeLessThan(16 * 480);
    await sleep(200);
    expect((await serverInfo(server.base)).generated_tokens).toBe(idle.generated_tokens);
    await expectAlive();
  });
});

/** A copy of a model folder whose lm_head has its signs flipped: another model, same shape. */
function flippedModel(from: string, to: string): string {
  cpSync(from, to, { recursive: true });
  const file = join(to, "model.safetensors");
  const buf = readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString("utf8"));
  const t = header["lm_head.weight"];
  expect(t.dtype).toBe("F32");
  const [begin, end] = t.data_offsets as [number, number];
  for (let i = 8 + n + begin; i < 8 + n + end; i += 4) buf[i + 3] = (buf[i + 3] as number) ^ 0x80;
  writeFileSync(file, buf);
  return to;
}

describe("POST /update_weights_from_disk", () => {
  let flipped: string;
  let flippedOutputs: number[][];

  beforeAll(async () => {
    flipped = flippedModel(QWEN, join(dir, "flipped"));
    // What the other model generates, from an engine started on it.
    const other = await startEngine(["--model", flipped]);
    try {
      const outs = await generateOk<Output[]>(other.base, {
        input_ids: cases.map((c) => c.prompt_ids),
        sampling_params: GREEDY,
      });
      flippedOutputs = outs.map((o) => o.output_ids);
    } finally {
      expect((await other.stop()).code).toBe(0);
    }
  }, 60_000);

  async function outputs(base: string): Promise<Output[]> {
    return generateOk<Output[]>(base, {
      input_ids: cases.map((c) => c.prompt_ids),
      sampling_params: GREEDY,
    });
  }

  it("switches to the new model's outputs and bumps weight_version; running sequences finish on the old weights", async () => {
    const s = await startEngine(["--model", QWEN]);
    try {
      const before = await outputs(s.base);
      expect(before.map((o) => o.output_ids)).toEqual(cases.map((c) => c.output_ids));
      expect(flippedOutputs).not.toEqual(cases.map((c) => c.output_ids));

      // A greedy job in flight when the update comes finishes on the old weights.
      const c = byName("len33");
      const job = startRequest(s.base, {
        input_ids: c.prompt_ids,
        sampling_params: { ...GREEDY, max_new_tokens: 400, n: 8 },
      });
      await waitFor(s.base, (i) => i.running_requests > 0, "the job to run");
      const r = await request(
        s.base,
        "POST",
        "/update_weights_from_disk",
        JSON.stringify({ model_path: flipped }),
      );
      expect(r.status).toBe(200);
      expect(r.json).toMatchObject({ success: true, weight_version: "1" });
      expect(typeof r.json.message).toBe("string");
      expect(typeof r.json.num_paused_requests).toBe("number");
      const old = await job.reply;
      expect(old.status).toBe(200);
      for (const o of old.json as Output[]) {
        expect(o.output_ids.slice(0, 24)).toEqual(c.output_ids);
        expect(o.meta_info.weight_version).toBe("0");
      }

      // The prefix cache was flushed: nothing is reused from the old weights' KV.
      const c70 = byName("len70");
      const first = await generateOk<Output>(s.base, {
        input_ids: c70.prompt_ids,
        sampling_params: GREEDY,
      });
      expect(first.meta_info.cached_tokens).toBe(0);
      const after = await outputs(s.base);
      expect(after.map((o) => o.output_ids)).toEqual(flippedOutputs);
      expect(after.map((o) => o.meta_info.weight_version)).toEqual(after.map(() => "1"));
      expect((await request(s.base, "GET", "/health")).json.weight_version).toBe("1");

      // And back, aborting what runs.
      const job2 = startRequest(s.base, LONG);
      await waitFor(s.base, (i) => i.running_requests > 0, "the second job to run");
      const back = await request(
        s.base,
        "POST",
        "/update_weights_from_disk",
        JSON.stringify({ model_path: QWEN, abort_all_requests: true }),
      );
      expect(back.json).toMatchObject({ success: true, weight_version: "2" });
      const aborted = await job2.reply;
      expect(aborted.status).toBe(200);
      for (const o of aborted.json as Output[]) {
        expect(o.meta_info.finish_reason.type).toBe("abort");
        expect(o.output_ids.length).toBeLessThan(480);
      }
      const again = await outputs(s.base);
      expect(again.map((o) => o.output_ids)).toEqual(cases.map((c) => c.output_ids));
      expect(again[0]?.meta_info.weight_version).toBe("2");
    } finally {
      expect((await s.stop()).code).toBe(0);
    }
  });
});

describe("a KV cache too small for the load", () => {
  it("queues sequences instead of failing, and answers them all correctly", async () => {
    // 0.1 MiB: 17 blocks of 16 tokens here (384 bytes a token): about four sequences at once.
    const s = await startEngine(["--model", QWEN, "--kv-cache-mb", "0.1"]);
    try {
      const info = await serverInfo(s.base);
      expect(info.kv_blocks_total).toBeLessThan(20);
      const load = cases.filter((c) => c.prompt_ids.length <= 45);
      const replies = await Promise.all(
        [0, 1, 2].flatMap(() =>
          load.map((c) =>
            generateOk<Output[]>(s.base, {
              input_ids: c.prompt_ids,
              sampling_params: { ...GREEDY, n: 3 },
              return_logprob: true,
            }),
          ),
        ),
      );
      replies.forEach((outs, i) => {
        const c = load[i % load.length] as GreedyCase;
        for (const o of outs) expect(o.output_ids).toEqual(c.output_ids);
      });
      // The cache was full at times: sequences waited for room (or were preempted and
      // recomputed), and every answer is still the reference.
      const after = await serverInfo(s.base);
      expect(after.kv_full_steps).toBeGreaterThan(0);
      expect(after.queued_requests).toBe(0);
      // A sequence that could never fit is refused, naming the input.
      const tooBig = await generate(s.base, {
        input_ids: byName("len70").prompt_ids,
        sampling_params: { max_new_tokens: 400 },
      });
      expect(tooBig.status).toBe(400);
      expect(tooBig.json.error).toContain('"input_ids"');
      expect(tooBig.json.error).toContain("--kv-cache-mb");
      await expectAlive(s.base);
    } finally {
      expect((await s.stop()).code).toBe(0);
    }
  });
});

describe("--skip-tokenizer-init", () => {
  it("serves token ids without tokenizer.json: text is empty, stop strings are refused", async () => {
    const bare = join(dir, "no-tokenizer");
    cpSync(QWEN, bare, { recursive: true });
    rmSync(join(bare, "tokenizer.json"));
    const refused = runCli(["serve-engine", "--model", bare, "--port", "0", ...ENGINE_ARGS]);
    expect(refused.code).toBe(1);
    expect(refused.stderr.trim().split("\n")).toHaveLength(1);
    expect(refused.stderr).toContain(`${join(bare, "tokenizer.json")}: no such file`);
    expect(refused.stderr).toContain("--skip-tokenizer-init");

    const s = await startEngine(["--model", bare, "--skip-tokenizer-init"]);
    try {
      expect(s.cli.output.stderr).toContain("no tokenizer");
      const c = byName("len17");
      const out = await generateOk<Output>(s.base, {
        input_ids: c.prompt_ids,
        sampling_params: GREEDY,
      });
      expect(out.output_ids).toEqual(c.output_ids);
      expect(out.text).toBe("");
      const stop = await generate(s.base, {
        input_ids: c.prompt_ids,
        sampling_params: { stop: ["a"] },
      });
      expect(stop.status).toBe(400);
      expect(stop.json.error).toContain('"sampling_params.stop"');
      expect((await serverInfo(s.base)).skip_tokenizer_init).toBe(true);
    } finally {
      expect((await s.stop()).code).toBe(0);
    }
  });
});

describe("--enforce-eager", () => {
  it("reaches the native engine (its command line), which runs as before", async () => {
    const s = await startEngine(["--model", QWEN, "--enforce-eager"]);
    try {
      const info = await serverInfo(s.base);
      expect(info).toMatchObject({ enforce_eager: true, cuda_graphs: false });
      const argv = readFileSync(`/proc/${info.engine_pid}/cmdline`, "utf8").split("\0");
      expect(argv).toContain("--enforce-eager");
      const c = byName("len17");
      const out = await generateOk<Output>(s.base, {
        input_ids: c.prompt_ids,
        sampling_params: GREEDY,
      });
      expect(out.output_ids).toEqual(c.output_ids);
    } finally {
      expect((await s.stop()).code).toBe(0);
    }
  });
});

describe("start-up and shutdown", () => {
  it("SIGTERM lets the requests in flight finish, refuses new connections, stops the engine, exits 0", async () => {
    const s = await startEngine(["--model", QWEN]);
    const c = byName("len45");
    const job = startRequest(s.base, {
      input_ids: c.prompt_ids,
      sampling_params: { ...GREEDY, max_new_tokens: 400, n: 8 },
    });
    await waitFor(s.base, (i) => i.running_requests > 0, "the job to run");
    const { engine_pid: enginePid } = await serverInfo(s.base);
    s.cli.child.kill("SIGTERM");
    const reply = await job.reply;
    expect(reply.status).toBe(200);
    expect(reply.headers.connection).toBe("close");
    for (const o of reply.json as Output[]) {
      expect(o.output_ids).toHaveLength(400);
      expect(o.output_ids.slice(0, 24)).toEqual(c.output_ids);
    }
    await expect(request(s.base, "GET", "/health")).rejects.toThrow(/ECONNREFUSED/);
    const result = await s.cli.result;
    expect(result.code).toBe(0);
    expect(result.stderr).toContain("SIGTERM: stopping; 1 request in flight to finish");
    expect(result.stderr).toContain("engine stopped");
    expect(() => process.kill(enginePid, 0)).toThrow();
  });

  it("answers 503 while the model loads (/health and /generate), then serves", async () => {
    // An engine that takes a while to start: a wrapper in SEARCHR1_NATIVE_DIR.
    const slow = join(dir, "slow-native");
    const real = join(process.cwd(), "native", "build", "searchr1-engine");
    writeExecutable(join(slow, "searchr1-engine"), `#!/bin/sh\nsleep 2\nexec "${real}" "$@"\n`);
    const cli = startCli(["serve-engine", "--model", QWEN, "--port", "0", ...ENGINE_ARGS], {
      env: { SEARCHR1_NATIVE_DIR: slow },
    });
    try {
      const base = await waitForLine(cli.output, /(http:\/\/\S+)\/health answers 503/);
      const health = await request(base, "GET", "/health");
      expect(health.status).toBe(503);
      expect(health.json).toMatchObject({ status: "loading", ready: false });
      expect(health.json.error).toContain(QWEN);
      const gen = await generate(base, { input_ids: [1] });
      expect(gen.status).toBe(503);
      expect(gen.json.error).toContain("loading");
      await waitForLine(cli.output, /^serving /m);
      expect((await request(base, "GET", "/health")).status).toBe(200);
      await expectAlive(base);
    } finally {
      cli.child.kill("SIGTERM");
      expect((await cli.result).code).toBe(0);
    }
  });

  it("SIGTERM while the model loads stops the engine and exits 130", async () => {
    const slow = join(dir, "slower-native");
    const real = join(process.cwd(), "native", "build", "searchr1-engine");
    writeExecutable(join(slow, "searchr1-engine"), `#!/bin/sh\nsleep 5\nexec "${real}" "$@"\n`);
    const cli = startCli(["serve-engine", "--model", QWEN, "--port", "0", ...ENGINE_ARGS], {
      env: { SEARCHR1_NATIVE_DIR: slow },
    });
    await waitForLine(cli.output, /health answers 503/);
    cli.child.kill("SIGTERM");
    const r = await cli.result;
    expect(r.code).toBe(130);
    expect(r.stderr).toContain("SIGTERM while the model was loading; stopped");
    expect(r.stderr).not.toContain("serving");
  });

  it("an engine that cannot load the model: exit 1 naming the engine and its stderr", () => {
    const broken = join(dir, "broken");
    cpSync(QWEN, broken, { recursive: true });
    writeFileSync(join(broken, "model.safetensors"), "not safetensors");
    const r = runCli(["serve-engine", "--model", broken, "--port", "0", ...ENGINE_ARGS]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(
      /searchr1: error: the native engine \(.*searchr1-engine\) could not load/,
    );
    expect(r.stderr).toContain("the last lines of its stderr:");
    expect(r.stderr).toContain("model.safetensors");
  });

  it("a missing model folder or flag: one clear line", () => {
    const missing = join(dir, "no-such-model");
    const a = runCli(["serve-engine", "--model", missing, "--port", "0"]);
    expect(a.code).toBe(1);
    expect(a.stderr).toContain(`${missing}: no such model folder (--model)`);
    const b = runCli(["serve-engine", "--port", "0"]);
    expect(b.code).toBe(2);
    expect(b.stderr).toContain('missing required key "model"');
    const c = runCli(["serve-engine", "--model", QWEN, "--device", "tpu"]);
    expect(c.code).toBe(2);
    expect(c.stderr).toContain("auto|cpu|cuda");
  });

  it("a port in use is a clear error", () => {
    const port = new URL(server.base).port;
    const r = runCli(["serve-engine", "--model", QWEN, "--port", port, ...ENGINE_ARGS]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`cannot listen on 127.0.0.1:${port}: the address is in use`);
  });

  it("--help shows the options with their defaults and examples", () => {
    const r = runCli(["serve-engine", "--help"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain("Usage: searchr1 serve-engine");
    expect(r.stdout).toMatch(/--port <port>\s+TCP port \(0 = any free port\) \(default: 30000\)/);
    expect(r.stdout).toContain("--skip-tokenizer-init");
    expect(r.stdout).toContain("SEARCHR1_ENGINE_PORT");
    expect(r.stdout).toMatch(/Examples:\n {2}\$ searchr1 serve-engine --model/);
  });
});

describe("the engine dies", () => {
  it("requests in flight get 500 naming the engine; the command exits 1 with its stderr", async () => {
    const s = await startEngine(["--model", QWEN]);
    const job = startRequest(s.base, LONG);
    await waitFor(s.base, (i) => i.running_requests > 0, "the job to run");
    const { engine_pid: enginePid } = await serverInfo(s.base);
    process.kill(enginePid, "SIGKILL");
    const reply = await job.reply;
    expect(reply.status).toBe(500);
    expect(reply.json.error).toMatch(
      /the native engine \(.*searchr1-engine, pid \d+\) was killed by SIGKILL/,
    );
    const result = await s.cli.result;
    expect(result.code).toBe(1);
    expect(result.stderr).toContain("searchr1: error: the native engine");
    expect(result.stderr).toContain("was killed by SIGKILL; the last lines of its stderr:");
    expect(result.stderr).toMatch(/searchr1: error: {3}searchr1-engine: .* on cpu/);
  });
});

function writeExecutable(path: string, text: string): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text, { mode: 0o755 });
}

/** Waits until the CLI's stderr matches `re`; resolves with the first group (or the match). */
async function waitForLine(output: { stderr: string }, re: RegExp, ms = 30_000): Promise<string> {
  const end = Date.now() + ms;
  for (;;) {
    const m = re.exec(output.stderr);
    if (m) return m[1] ?? m[0];
    if (Date.now() > end) throw new Error(`no line matching ${re} in: ${output.stderr}`);
    await sleep(20);
  }
}
