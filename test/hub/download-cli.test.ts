import { existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { gzipSync } from "node:zlib";
import { afterEach, describe, expect, it } from "vitest";
import { runCli, startCli } from "../helpers/cli.js";
import { createHubServer, type HubRepo, type HubServer } from "../helpers/hub-server.js";
import { pattern, saveDir, waitFor } from "./fixtures.js";

const BIG = pattern(1_500_000, 7);
const SMALL = Buffer.from('{"architectures":["Qwen2ForCausalLM"]}\n');

const DEMO: HubRepo = {
  id: "org/demo",
  type: "dataset",
  files: [
    { path: "big.bin", content: BIG, lfs: true },
    { path: "meta/config.json", content: SMALL },
  ],
};

let hub: HubServer | undefined;
const cleanups: (() => void)[] = [];

afterEach(async () => {
  await hub?.close();
  hub = undefined;
  for (const c of cleanups.splice(0)) c();
});

async function serve(repos: HubRepo[], token?: string): Promise<HubServer> {
  hub = await createHubServer({ repos, token, pageSize: 2 });
  return hub;
}

function tmp(): string {
  const t = saveDir();
  cleanups.push(t.cleanup);
  return t.dir;
}

/** The CLI against the fake hub, with fast retries so fault tests stay quick. */
function download(dir: string, args: string[], env: Record<string, string> = {}) {
  return startCli(["download", "--save-path", dir, ...args, "backoff_s=0.01"], {
    env: { HF_ENDPOINT: hub?.url ?? "", HF_TOKEN: "", ...env },
  });
}

function dataGets(server: HubServer) {
  return server.requests.filter(
    (r) => r.method === "GET" && (r.path.startsWith("/storage/") || r.path.includes("/resolve/")),
  );
}

describe("searchr1 download --repo", () => {
  it("fetches a repository through the tree API and resolve redirects, verified, in its layout", async () => {
    const server = await serve([DEMO]);
    const dir = tmp();
    const r = await download(dir, ["--repo", "org/demo"]).result;
    expect(r.code, r.stderr).toBe(0);
    expect(readFileSync(path.join(dir, "big.bin")).equals(BIG)).toBe(true);
    expect(readFileSync(path.join(dir, "meta/config.json")).equals(SMALL)).toBe(true);
    expect(readdirSync(dir).some((f) => f.endsWith(".incomplete"))).toBe(false);
    // Paginated listing (page size 2, three entries with the folder) was followed.
    expect(server.requests.filter((q) => q.path.includes("/tree/")).length).toBe(2);
    // LFS bytes came from the storage host the hub redirected to.
    expect(
      dataGets(server).some(
        (q) => q.path.startsWith("/storage/") && q.host?.startsWith("127.0.0.1"),
      ),
    ).toBe(true);
    expect(r.stdout).toMatch(/big\.bin\s+1\.4 MiB\s+downloaded, verified/);

    // A second run finds both files verified and moves no data.
    const before = dataGets(server).length;
    const again = await download(dir, ["--repo", "org/demo"]).result;
    expect(again.code, again.stderr).toBe(0);
    expect(dataGets(server).length).toBe(before);
    expect(again.stdout).toMatch(/big\.bin\s+1\.4 MiB\s+present/);
  });

  it("verifies files already on disk from another tool instead of fetching them again", async () => {
    const server = await serve([DEMO]);
    const dir = tmp();
    writeFileSync(path.join(dir, "big.bin"), BIG);
    mkdirSync(path.join(dir, "meta"));
    // Same size as the hub's file, different bytes: only the hash can tell.
    writeFileSync(path.join(dir, "meta/config.json"), SMALL.toString().replace("Qwen2", "Llama"));
    const r = await download(dir, ["--repo", "org/demo"]).result;
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/big\.bin: already present, verified/);
    expect(r.stderr).toMatch(
      /meta\/config\.json: present but its git-sha1 differs from the hub's; downloading it again/,
    );
    expect(dataGets(server).map((q) => q.path)).toEqual([
      "/datasets/org/demo/resolve/main/meta/config.json",
    ]);
    expect(readFileSync(path.join(dir, "meta/config.json")).equals(SMALL)).toBe(true);
    expect(r.stdout).toMatch(/big\.bin\s+1\.4 MiB\s+present \(verified\)/);
  });

  it("takes only the files --include selects", async () => {
    await serve([DEMO]);
    const dir = tmp();
    const r = await download(dir, ["--repo", "org/demo", "--include", "meta/*"]).result;
    expect(r.code, r.stderr).toBe(0);
    expect(existsSync(path.join(dir, "meta/config.json"))).toBe(true);
    expect(existsSync(path.join(dir, "big.bin"))).toBe(false);
  });

  it("splits a large file into parallel range requests written in place", async () => {
    const large = pattern(4 << 20, 3);
    const server = await serve([
      { id: "org/large", type: "model", files: [{ path: "w.bin", content: large, lfs: true }] },
    ]);
    const dir = tmp();
    const r = await download(dir, [
      "--repo",
      "org/large",
      "--repo-type",
      "model",
      "--connections",
      "8",
      "piece_mb=0.25",
    ]).result;
    expect(r.code, r.stderr).toBe(0);
    expect(readFileSync(path.join(dir, "w.bin")).equals(large)).toBe(true);
    const ranges = dataGets(server)
      .map((q) => /bytes=(\d+)-(\d+)/.exec(q.range ?? ""))
      .map((m) => [Number(m?.[1]), Number(m?.[2])] as const)
      .sort((a, b) => a[0] - b[0]);
    expect(ranges.length).toBe(16);
    ranges.forEach(([start, end], i) => {
      expect(start).toBe(i * 262144);
      expect(end).toBe(Math.min(large.length, (i + 1) * 262144) - 1);
    });
  });

  it("retries 503 bursts and dropped connections, resuming each range where it broke", async () => {
    const server = await serve([DEMO]);
    server.setFaults({ status503: 3 });
    const dir = tmp();
    const r = await download(dir, ["--repo", "org/demo", "--include", "big.bin"]).result;
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/HTTP 503 .*retry 1\/8/);
    server.setFaults({ dropAfterBytes: 300_000, dropTimes: 2 });
    const dir2 = tmp();
    const r2 = await download(dir2, ["--repo", "org/demo", "--include", "big.bin"]).result;
    expect(r2.code, r2.stderr).toBe(0);
    expect(readFileSync(path.join(dir2, "big.bin")).equals(BIG)).toBe(true);
    // The cut connections were resumed from the bytes received (the server sent 300,000 per
    // connection; the client may have had slightly fewer in hand when the socket closed).
    const starts = dataGets(server)
      .slice(-3)
      .map((q) => Number(/bytes=(\d+)-/.exec(q.range ?? "")?.[1]));
    expect(starts[0]).toBe(0);
    expect(starts[1]).toBeGreaterThan(0);
    expect(starts[1]).toBeLessThanOrEqual(300_000);
    expect(starts[2]).toBeGreaterThan(starts[1] as number);
    expect(starts[2]).toBeLessThanOrEqual((starts[1] as number) + 300_000);
  });

  it("asks the hub for a fresh storage URL when the signed one has expired", async () => {
    const server = await serve([DEMO]);
    server.setFaults({ expiredStorage: 1 });
    const dir = tmp();
    const r = await download(dir, ["--repo", "org/demo", "--include", "big.bin"]).result;
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/HTTP 403 .*the storage URL expired, renewed it; retry 1\/8/);
    expect(server.requests.filter((q) => q.method === "HEAD").length).toBe(2);
    expect(readFileSync(path.join(dir, "big.bin")).equals(BIG)).toBe(true);
  });

  it("rejects corrupted bytes and leaves no file behind", async () => {
    const server = await serve([DEMO]);
    server.setFaults({ corruptPath: "big.bin" });
    const dir = tmp();
    const r = await download(dir, ["--repo", "org/demo"]).result;
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(
      /big\.bin: sha256 mismatch \(expected [0-9a-f]{64}, got [0-9a-f]{64}\)/,
    );
    expect(existsSync(path.join(dir, "big.bin"))).toBe(false);
    expect(existsSync(path.join(dir, "big.bin.incomplete"))).toBe(false);
    // The other file was still fetched and verified (git blob sha1).
    expect(existsSync(path.join(dir, "meta/config.json"))).toBe(true);
  });

  it("catches a corrupted small file through its git blob sha1", async () => {
    const server = await serve([DEMO]);
    server.setFaults({ corruptPath: "meta/config.json" });
    const r = await download(tmp(), ["--repo", "org/demo", "--include", "meta/*"]).result;
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/meta\/config\.json: git-sha1 mismatch/);
  });
});

describe("progress", () => {
  it("prints periodic plain lines and per-file results when stderr is not a terminal", async () => {
    const server = await serve([DEMO]);
    server.setFaults({ bytesPerSecond: 1_000_000 });
    const r = await download(tmp(), ["--repo", "org/demo", "progress_s=0.2"]).result;
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr.includes("\u001b[")).toBe(false);
    const lines = r.stderr.split("\n").filter((l) => l.startsWith("downloaded "));
    expect(lines.length).toBeGreaterThanOrEqual(2);
    expect(lines[0]).toMatch(
      /^downloaded [\d.]+ [KM]iB of 1\.4 MiB \(\d+\.\d%\), [\d.]+ [KM]iB\/s, ETA [\d.]+ s; big\.bin \d+%/,
    );
    expect(r.stderr).toMatch(
      /^big\.bin: downloaded, 1\.4 MiB in [\d.]+ s \([\d.]+ [KM]iB\/s\), verified$/m,
    );
    const quiet = await download(tmp(), ["--repo", "org/demo", "--quiet"]).result;
    expect(quiet.code).toBe(0);
    expect(quiet.stderr).toBe("");
    expect(quiet.stdout).toMatch(/big\.bin\s+1\.4 MiB\s+downloaded, verified/);
  });
});

describe("options", () => {
  it("names a missing --save-path and bad values before any request", () => {
    const r = runCli(["download"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/save_path/);
    const bad = runCli(["download", "--save-path", "x", "--connections", "0"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/connections/);
  });
});

/** A port nothing listens on: bound once by the OS, then released. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** Nothing of a stack trace, and no "internal error": one clean line per problem. */
function expectNoStack(stderr: string) {
  expect(stderr).not.toMatch(/internal error/);
  expect(stderr).not.toMatch(/^\s+at /m);
}

describe("unreachable hub", () => {
  it("announces each retry of a refused connection, then fails in one line naming the endpoint", async () => {
    const port = await closedPort();
    const endpoint = `http://127.0.0.1:${port}`;
    const started = Date.now();
    const r = await startCli(
      ["download", "--save-path", tmp(), "--dry-run", "retries=2", "backoff_s=0.01"],
      { env: { HF_ENDPOINT: endpoint, HF_TOKEN: "" } },
    ).result;
    expect(Date.now() - started).toBeLessThan(20_000);
    expect(r.code).toBe(1);
    expectNoStack(r.stderr);
    const lines = r.stderr.trim().split("\n");
    expect(lines).toHaveLength(3);
    expect(lines[0]).toMatch(
      new RegExp(
        `^hub unreachable \\(connection refused, 127\\.0\\.0\\.1:${port}\\), retry 1/2 in [\\d.]+ s$`,
      ),
    );
    expect(lines[1]).toMatch(/^hub unreachable .*retry 2\/2 in/);
    expect(lines[2]).toBe(
      `searchr1: error: cannot reach the hub at ${endpoint}: connection refused (ECONNREFUSED); check HF_ENDPOINT (the hub URL), the network connection, and any proxy or firewall in between`,
    );
  });

  it("names a host that does not resolve", async () => {
    // .invalid never resolves (RFC 2606); without any DNS server the lookup fails as EAI_AGAIN.
    const r = await startCli(
      ["download", "--save-path", tmp(), "--dry-run", "retries=1", "backoff_s=0.01"],
      { env: { HF_ENDPOINT: "http://hub.invalid", HF_TOKEN: "" } },
    ).result;
    expect(r.code).toBe(1);
    expectNoStack(r.stderr);
    expect(r.stderr).toMatch(
      /searchr1: error: cannot reach the hub at http:\/\/hub\.invalid: (host name not found \(DNS\) \(ENOTFOUND\)|DNS lookup failed.*); check HF_ENDPOINT/,
    );
  });

  it("reports a TLS failure in one line, without retrying it", async () => {
    const server = await serve([DEMO]);
    // The fake hub speaks plain HTTP: a TLS handshake with it fails.
    const r = await startCli(
      ["download", "--save-path", tmp(), "--repo", "org/demo", "--dry-run", "backoff_s=0.01"],
      { env: { HF_ENDPOINT: server.url.replace("http:", "https:"), HF_TOKEN: "" } },
    ).result;
    expect(r.code).toBe(1);
    expectNoStack(r.stderr);
    expect(r.stderr).not.toMatch(/retry/);
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
    expect(r.stderr).toMatch(
      /^searchr1: error: cannot talk to the hub at https:\/\/[^:]+:\d+: TLS error: .*; check HF_ENDPOINT \(https:\/\/ for a TLS server/,
    );
  });
});

describe("hub refusals", () => {
  const GATED: HubRepo = { id: "meta/gated", type: "model", gated: true, files: DEMO.files };

  it("says to set HF_TOKEN for a gated repo, and sends the token only to the hub", async () => {
    const server = await serve([GATED], "hf_secret");
    const dir = tmp();
    const r = await download(dir, ["--repo", "meta/gated", "--repo-type", "model"]).result;
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(
      /model meta\/gated@main: access denied \(HTTP 401\); meta\/gated is gated or private: accept its terms on the hub and set HF_TOKEN \(or --token\)/,
    );
    expect(readdirSync(dir)).toEqual([]);

    const ok = await download(dir, ["--repo", "meta/gated", "--repo-type", "model"], {
      HF_TOKEN: "hf_secret",
    }).result;
    expect(ok.code, ok.stderr).toBe(0);
    const storage = server.requests.filter((q) => q.path.startsWith("/storage/"));
    expect(storage.length).toBeGreaterThan(0);
    expect(storage.every((q) => q.authorization === undefined)).toBe(true);
    expect(
      server.requests
        .filter((q) => q.path.includes("/resolve/"))
        .every((q) => q.authorization === "Bearer hf_secret"),
    ).toBe(true);

    const wrong = await download(tmp(), [
      "--repo",
      "meta/gated",
      "--repo-type",
      "model",
      "--token",
      "hf_wrong",
    ]).result;
    expect(wrong.code).toBe(1);
    expect(wrong.stderr).toMatch(
      /check that HF_TOKEN \/ --token belongs to an account with access/,
    );
  });

  it("names the repository or revision that does not exist, without retrying", async () => {
    const server = await serve([DEMO]);
    const r = await download(tmp(), ["--repo", "org/missing"]).result;
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(
      /dataset org\/missing@main: repository not found \(HTTP 401\); check the name and --repo-type, or set HF_TOKEN if it is private/,
    );
    const rev = await download(tmp(), ["--repo", "org/demo", "--revision", "v9"]).result;
    expect(rev.code).toBe(1);
    expect(rev.stderr).toMatch(/dataset org\/demo@v9: revision "v9" does not exist/);
    expect(server.requests.filter((q) => q.path.includes("/tree/")).length).toBe(2);
  });

  it("refuses to start when the disk lacks room, saying how much is needed", async () => {
    await serve([
      {
        id: "org/huge",
        type: "dataset",
        files: [{ path: "huge.bin", content: BIG, lfs: true, declaredSize: 2 ** 50 }],
      },
    ]);
    const dir = tmp();
    const r = await download(path.join(dir, "sub"), ["--repo", "org/huge"]).result;
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(
      /not enough disk space in .*sub: need 1\.0 PiB \(downloads 1\.0 PiB\), [\d.]+ [KMGT]?i?B free/,
    );
    expect(readdirSync(dir)).toEqual([]);
  });
});

describe("interrupted downloads", () => {
  for (const signal of ["SIGINT", "SIGKILL"] as const) {
    it(`resumes with a Range request after ${signal} mid-file, with identical bytes`, async () => {
      const server = await serve([DEMO]);
      server.setFaults({ bytesPerSecond: 400_000 });
      const dir = tmp();
      const partial = path.join(dir, "big.bin.incomplete");
      const first = download(dir, ["--repo", "org/demo", "--include", "big.bin"]);
      await waitFor(
        () => existsSync(partial) && statSync(partial).size > 200_000,
        15_000,
        "a partial file",
      );
      first.child.kill(signal);
      const r = await first.result;
      if (signal === "SIGINT") {
        expect(r.code).toBe(130);
        expect(r.stderr).toMatch(
          /interrupted; partial downloads are kept as <file>\.incomplete, run the same command to resume/,
        );
      }
      const kept = statSync(partial).size;
      expect(kept).toBeGreaterThan(200_000);
      expect(kept).toBeLessThan(BIG.length);

      server.setFaults({});
      const seen = server.requests.length;
      const again = await download(dir, ["--repo", "org/demo", "--include", "big.bin"]).result;
      expect(again.code, again.stderr).toBe(0);
      const resumed = server.requests.slice(seen).filter((q) => q.path.startsWith("/storage/"));
      expect(resumed.map((q) => q.range)).toEqual([`bytes=${kept}-${BIG.length - 1}`]);
      expect(again.stdout).toMatch(/resumed from/);
      expect(readFileSync(path.join(dir, "big.bin")).equals(BIG)).toBe(true);
      expect(existsSync(partial)).toBe(false);
    });
  }
});

describe("Search-R1 artefacts", () => {
  const partAa = pattern(700_000, 11);
  const partAb = pattern(300_000, 12);
  const corpus = `${Array.from({ length: 2000 }, (_, i) => JSON.stringify({ id: String(i), contents: `"Title ${i}"\ntext ${i}` })).join("\n")}\n`;
  const BUNDLE: HubRepo[] = [
    {
      id: "PeterJinGo/wiki-18-e5-index",
      type: "dataset",
      files: [
        { path: "part_aa", content: partAa, lfs: true },
        { path: "part_ab", content: partAb, lfs: true },
        { path: ".gitattributes", content: Buffer.from("* filter=lfs\n") },
      ],
    },
    {
      id: "PeterJinGo/wiki-18-corpus",
      type: "dataset",
      files: [{ path: "wiki-18.jsonl.gz", content: gzipSync(corpus), lfs: true }],
    },
  ];

  it("fetches the default bundle and finishes its manual steps (join parts, expand corpus)", async () => {
    const server = await serve(BUNDLE);
    const dir = tmp();
    const r = await download(dir, []).result;
    expect(r.code, r.stderr).toBe(0);
    expect(
      readFileSync(path.join(dir, "e5_Flat.index")).equals(Buffer.concat([partAa, partAb])),
    ).toBe(true);
    expect(readFileSync(path.join(dir, "wiki-18.jsonl"), "utf8")).toBe(corpus);
    expect(readdirSync(dir).sort()).toEqual([
      ".searchr1-download.json",
      "e5_Flat.index",
      "wiki-18.jsonl",
    ]);
    expect(r.stdout).toMatch(/e5_Flat\.index\s+976\.6 KiB\s+joined 2 parts/);
    expect(r.stdout).toMatch(/wiki-18\.jsonl\s+[\d.]+ KiB\s+expanded/);

    // Finished artefacts are recognised: nothing is fetched again although the parts are gone.
    const before = dataGets(server).length;
    const again = await download(dir, []).result;
    expect(again.code, again.stderr).toBe(0);
    expect(dataGets(server).length).toBe(before);
    expect(again.stdout).toMatch(/e5_Flat\.index\s+present/);
    expect(again.stdout).toMatch(/wiki-18\.jsonl\s+present/);
  });

  it("keeps the parts and the .gz when asked", async () => {
    await serve(BUNDLE);
    const dir = tmp();
    const r = await download(dir, ["--keep-parts", "--keep-gz"]).result;
    expect(r.code, r.stderr).toBe(0);
    expect(readdirSync(dir).sort()).toEqual([
      ".searchr1-download.json",
      "e5_Flat.index",
      "part_aa",
      "part_ab",
      "wiki-18.jsonl",
      "wiki-18.jsonl.gz",
    ]);
  });

  it("lists files and sizes with --dry-run and writes nothing", async () => {
    const server = await serve(BUNDLE);
    const dir = tmp();
    const r = await download(path.join(dir, "data"), ["--dry-run"]).result;
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(
      /PeterJinGo\/wiki-18-e5-index: part_aa -> part_aa\s+683\.6 KiB\s+to download/,
    );
    expect(r.stdout).toMatch(/^e5_Flat\.index\s+made after download$/m);
    expect(r.stdout).toMatch(/^wiki-18\.jsonl\s+made after download$/m);
    expect(r.stdout).toMatch(/to download: [\d.]+ KiB \(dry run: nothing was written\)/);
    expect(readdirSync(dir)).toEqual([]);
    expect(dataGets(server)).toEqual([]);
  });

  it("fetches FlashRAG folders, model files only, and extracts archives", async () => {
    const tarball = await makeTarGz({ "bm25/index.txt": "postings\n", "bm25/meta.json": "{}\n" });
    await serve([
      {
        id: "RUC-NLPIR/FlashRAG_datasets",
        type: "dataset",
        files: [
          { path: "nq/train.jsonl", content: Buffer.from('{"question":"q"}\n') },
          { path: "nq/test.jsonl", content: Buffer.from('{"question":"t"}\n') },
          { path: "hotpotqa/dev.jsonl", content: Buffer.from('{"question":"h"}\n') },
          { path: "popqa/test.jsonl", content: Buffer.from('{"question":"p"}\n') },
        ],
      },
      {
        id: "Qwen/Qwen2.5-0.5B",
        type: "model",
        files: [
          { path: "config.json", content: SMALL },
          { path: "model.safetensors", content: pattern(50_000, 5), lfs: true },
          { path: "pytorch_model.bin", content: pattern(50_000, 6), lfs: true },
          { path: "tokenizer.json", content: Buffer.from("{}") },
          { path: "vocab.txt", content: Buffer.from("[PAD]\n[UNK]\n") },
          { path: "README.md", content: Buffer.from("# model") },
        ],
      },
      {
        id: "PeterJinGo/wiki-18-bm25-index",
        type: "dataset",
        files: [{ path: "bm25.tar.gz", content: tarball, lfs: true }],
      },
    ]);
    const dir = tmp();
    const r = await download(dir, ["--what", "flashrag:nq,hotpotqa,model:Qwen/Qwen2.5-0.5B,bm25"])
      .result;
    expect(r.code, r.stderr).toBe(0);
    expect(readdirSync(path.join(dir, "FlashRAG_datasets")).sort()).toEqual(["hotpotqa", "nq"]);
    expect(readdirSync(path.join(dir, "FlashRAG_datasets/nq")).sort()).toEqual([
      "test.jsonl",
      "train.jsonl",
    ]);
    expect(readdirSync(path.join(dir, "Qwen2.5-0.5B")).sort()).toEqual([
      "config.json",
      "model.safetensors",
      "tokenizer.json",
      "vocab.txt",
    ]);
    expect(readFileSync(path.join(dir, "bm25/index.txt"), "utf8")).toBe("postings\n");
    expect(existsSync(path.join(dir, "bm25.tar.gz"))).toBe(false);
  });

  it("names a FlashRAG dataset that does not exist and lists those that do", async () => {
    await serve([
      {
        id: "RUC-NLPIR/FlashRAG_datasets",
        type: "dataset",
        files: [{ path: "nq/train.jsonl", content: SMALL }],
      },
    ]);
    const r = await download(tmp(), ["--what", "flashrag:nqq"]).result;
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(
      /flashrag:nqq: nothing in dataset RUC-NLPIR\/FlashRAG_datasets matches nqq\/\* \(it has: nq\)/,
    );
  });
});

async function makeTarGz(files: Record<string, string>): Promise<Buffer> {
  const { mkdtempSync, writeFileSync, mkdirSync, rmSync } = await import("node:fs");
  const os = await import("node:os");
  const tar = await import("tar");
  const src = mkdtempSync(path.join(os.tmpdir(), "searchr1-tar-"));
  try {
    for (const [name, text] of Object.entries(files)) {
      mkdirSync(path.dirname(path.join(src, name)), { recursive: true });
      writeFileSync(path.join(src, name), text);
    }
    const out = path.join(src, "a.tar.gz");
    await tar.c({ gzip: true, file: out, cwd: src }, Object.keys(files));
    return readFileSync(out);
  } finally {
    rmSync(src, { recursive: true, force: true });
  }
}
