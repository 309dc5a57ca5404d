import { createHash } from "node:crypto";
import { open, readFile } from "node:fs/promises";
import path from "node:path";
import { Writable } from "node:stream";
import { describe, expect, it } from "vitest";
import { parseSelections } from "../../src/hub/artifacts.js";
import { HubClient, nextLink } from "../../src/hub/client.js";
import { ensureSpace } from "../../src/hub/disk.js";
import { fetchFile, pieceSize } from "../../src/hub/fetch-file.js";
import { globToRegExp } from "../../src/hub/glob.js";
import {
  explainHubError,
  HubStatusError,
  isRetryable,
  retryNotice,
  transportFailure,
} from "../../src/hub/http-errors.js";
import { PieceWriter, splitPieces } from "../../src/hub/piece-writer.js";
import { withRetries } from "../../src/hub/retry.js";
import { createTransferProgress } from "../../src/runtime/transfer-progress.js";
import { createHubServer } from "../helpers/hub-server.js";
import { pattern, saveDir } from "./fixtures.js";

describe("hub protocol details", () => {
  it("matches include patterns the way huggingface_hub's fnmatch does", () => {
    expect(globToRegExp("*.safetensors").test("sub/model-00001-of-00002.safetensors")).toBe(true);
    expect(globToRegExp("part_*").test("part_aa")).toBe(true);
    expect(globToRegExp("part_?b").test("part_ab")).toBe(true);
    expect(globToRegExp("nq/").test("nq/train.jsonl")).toBe(true);
    expect(globToRegExp("[!a]*.json").test("config.json")).toBe(true);
    expect(globToRegExp("[!c]*.json").test("config.json")).toBe(false);
    expect(globToRegExp("a.json").test("a_json")).toBe(false);
  });

  it("follows Link rel=next", () => {
    expect(nextLink('<https://hub/api/x?cursor=abc>; rel="next"')).toBe(
      "https://hub/api/x?cursor=abc",
    );
    expect(nextLink('<https://hub/a>; rel="prev", <https://hub/b>; rel="next"')).toBe(
      "https://hub/b",
    );
    expect(nextLink(undefined)).toBeUndefined();
  });
});

describe("selections", () => {
  const base = { what: [] as string[], repo: null, repoType: "dataset" as const, include: [] };

  it("defaults to what Search-R1's download.py fetches", () => {
    expect(parseSelections(base).map((a) => a.name)).toEqual(["e5-flat", "corpus"]);
  });

  it("reads flashrag:<a>,<b> (split at the comma by the list option) as two datasets", () => {
    const a = parseSelections({
      ...base,
      what: ["flashrag:nq", "hotpotqa", "bm25", "model:Qwen/Qwen2.5-3B"],
    });
    expect(a.map((x) => x.name)).toEqual([
      "flashrag:nq",
      "flashrag:hotpotqa",
      "bm25",
      "model:Qwen/Qwen2.5-3B",
    ]);
    expect(a[1]?.include).toEqual(["hotpotqa/*"]);
    expect(a[3]?.dir).toBe("Qwen2.5-3B");
  });

  it("rejects unknown names, malformed repositories and --include without --repo", () => {
    expect(() => parseSelections({ ...base, what: ["e5"] })).toThrow(
      /--what: unknown selection "e5"; expected one of e5-flat, corpus, bm25, e5-hnsw, nq-hotpotqa/,
    );
    expect(() => parseSelections({ ...base, what: ["model:qwen"] })).toThrow(
      /--what model:qwen: expected model:OWNER\/NAME/,
    );
    expect(() => parseSelections({ ...base, repo: "a/b/c" })).toThrow(
      /--repo a\/b\/c: expected OWNER\/NAME/,
    );
    expect(() => parseSelections({ ...base, include: ["*.json"] })).toThrow(
      /--include applies to --repo/,
    );
  });
});

describe("piece sizes", () => {
  const MiB = 2 ** 20;
  it("uses one request for what fits a piece, and spreads mid-size files over every connection", () => {
    const s = { connections: 8, pieceBytes: 16 * MiB };
    expect(pieceSize(10 * MiB, s)).toBe(10 * MiB);
    expect(pieceSize(64 * MiB, s)).toBe(8 * MiB);
    expect(pieceSize(40 * 2 ** 30, s)).toBe(16 * MiB);
    expect(pieceSize(17 * MiB, { ...s, connections: 1 })).toBe(17 * MiB);
    expect(pieceSize(4 * MiB, { connections: 8, pieceBytes: MiB / 4 })).toBe(MiB / 4);
    expect(pieceSize(20 * MiB, { connections: 64, pieceBytes: 16 * MiB })).toBe(MiB);
  });
});

describe("ordered piece writer", () => {
  it("keeps the file a contiguous prefix and hashes in order while pieces arrive out of order", async () => {
    const t = saveDir();
    try {
      const data = pattern(10_000, 9);
      const file = path.join(t.dir, "f");
      const fh = await open(file, "w");
      const hash = createHash("sha256");
      const pieces = splitPieces(0, data.length, 4000);
      const w = new PieceWriter(fh, hash, pieces, 0);
      await w.add(2, data.subarray(8000));
      await w.complete(2);
      await w.add(1, data.subarray(4000, 8000));
      await w.complete(1);
      expect(w.written).toBe(0);
      await w.add(0, data.subarray(0, 1000));
      expect(w.written).toBe(1000);
      expect((await readFile(file)).length).toBe(1000);
      await w.add(0, data.subarray(1000, 4000));
      await w.complete(0);
      expect(w.written).toBe(10_000);
      await fh.close();
      expect((await readFile(file)).equals(data)).toBe(true);
      expect(hash.digest("hex")).toBe(createHash("sha256").update(data).digest("hex"));
    } finally {
      t.cleanup();
    }
  });
});

describe("errors and retries", () => {
  it("retries server errors with back-off but not refusals", async () => {
    let calls = 0;
    const ok = await withRetries(
      async () => {
        calls++;
        if (calls < 3) throw new HubStatusError(502, "http://x", undefined, undefined);
        return "done";
      },
      { retries: 5, backoffS: 0.001 },
      undefined,
    );
    expect([ok, calls]).toEqual(["done", 3]);
    calls = 0;
    await expect(
      withRetries(
        async () => {
          calls++;
          throw new HubStatusError(404, "http://x", "EntryNotFound", "Entry not found");
        },
        { retries: 5, backoffS: 0.001 },
        undefined,
      ),
    ).rejects.toThrow(/HTTP 404/);
    expect(calls).toBe(1);
  });

  it("names repository, revision and path of a missing file", async () => {
    const hub = await createHubServer({
      repos: [
        { id: "org/r", type: "model", files: [{ path: "a.json", content: Buffer.from("{}") }] },
      ],
    });
    const t = saveDir();
    try {
      const client = new HubClient({
        endpoint: hub.url,
        token: null,
        timeoutS: 5,
        retries: 2,
        backoffS: 0.01,
      });
      const repo = { id: "org/r", type: "model" as const, revision: "main" };
      const err = await fetchFile(
        client,
        {
          repo,
          remote: { path: "nope.json", size: 2, gitOid: "0".repeat(40) },
          dest: path.join(t.dir, "nope.json"),
        },
        { connections: 1, pieceBytes: 1 << 20 },
        new AbortController().signal,
      ).catch((e) => explainHubError(e, { repo, path: "nope.json", hasToken: false }));
      expect((err as Error).message).toBe(
        "nope.json: no such file in model org/r at revision main (HTTP 404)",
      );
      expect(hub.requests.filter((q) => q.method === "HEAD").length).toBe(1);
    } finally {
      t.cleanup();
      await hub.close();
    }
  });

  it("classifies connections that fail before any answer, and retries only the transient ones", () => {
    const at = (code: string, extra: object = {}) =>
      Object.assign(new Error(`boom ${code}`), {
        code,
        options: { url: new URL("https://cdn.example/x") },
        ...extra,
      });
    const cases: [string, object, string, boolean][] = [
      ["ECONNREFUSED", {}, "connection refused", true],
      ["ENOTFOUND", {}, "host name not found (DNS)", false],
      ["EAI_AGAIN", {}, "DNS lookup failed (temporary)", true],
      ["EHOSTUNREACH", {}, "no route to host", true],
      ["DEPTH_ZERO_SELF_SIGNED_CERT", {}, "TLS error: boom DEPTH_ZERO_SELF_SIGNED_CERT", false],
      ["CERT_HAS_EXPIRED", {}, "TLS error: boom CERT_HAS_EXPIRED", false],
      ["ERR_TLS_CERT_ALTNAME_INVALID", {}, "TLS error: boom ERR_TLS_CERT_ALTNAME_INVALID", false],
      [
        "ETIMEDOUT",
        { name: "TimeoutError", event: "connect" },
        "no connection within the timeout",
        true,
      ],
    ];
    for (const [code, extra, reason, retried] of cases) {
      const err = at(code, extra);
      expect(transportFailure(err)?.reason, code).toBe(reason);
      expect(transportFailure(err)?.unreachable, code).toBe(true);
      expect(isRetryable(err), code).toBe(retried);
    }
    const openssl = at("EPROTO", {
      message:
        "write EPROTO 80CC:error:0A00010B:SSL routines:ssl3_get_record:wrong version number:x.c:350:",
    });
    expect(transportFailure(openssl)?.reason).toBe("TLS error: wrong version number");
    expect(
      transportFailure(at("ETIMEDOUT", { name: "TimeoutError", event: "response" }))?.unreachable,
    ).toBe(false);
    expect(
      transportFailure(new HubStatusError(503, "http://x", undefined, undefined)),
    ).toBeUndefined();
    expect(transportFailure(new Error("plain"))).toBeUndefined();
  });

  it("announces retries in one line, naming the hub or the storage host", () => {
    const refused = (url: string) =>
      Object.assign(new Error("connect ECONNREFUSED"), {
        code: "ECONNREFUSED",
        options: { url: new URL(url) },
      });
    const ctx = { label: "a.bin", endpoint: "http://127.0.0.1:9", retries: 8 };
    expect(retryNotice(refused("http://127.0.0.1:9/api/x"), 2, 4000, ctx)).toBe(
      "hub unreachable (connection refused, 127.0.0.1:9), retry 2/8 in 4.0 s",
    );
    expect(retryNotice(refused("https://cdn.example/x"), 1, 12_400, ctx)).toBe(
      "storage host cdn.example unreachable (connection refused, cdn.example), retry 1/8 in 12 s",
    );
    expect(
      retryNotice(
        new HubStatusError(503, "http://127.0.0.1:9/x", undefined, undefined),
        3,
        250,
        ctx,
      ),
    ).toBe("a.bin: HTTP 503 from http://127.0.0.1:9/x; retry 3/8 in 0.25 s");
    const repo = { id: "org/r", type: "model" as const, revision: "main" };
    const e = explainHubError(refused("https://cdn.example/x"), {
      repo,
      path: "a.bin",
      hasToken: false,
      endpoint: "http://127.0.0.1:9",
    });
    expect(e.message).toBe(
      "cannot reach https://cdn.example (where the hub at http://127.0.0.1:9 sent a.bin in model org/r@main): connection refused (ECONNREFUSED); check that this host is reachable, the network connection, and any proxy or firewall in between",
    );
  });

  it("refuses when the filesystem lacks room, itemising the need", async () => {
    await expect(
      ensureSpace("/tmp/does/not/exist/yet", [
        { label: "downloads", bytes: 2 ** 50 },
        { label: "joining parts", bytes: 2 ** 40 },
      ]),
    ).rejects.toThrow(
      /not enough disk space in \/tmp\/does\/not\/exist\/yet: need 1\.0 PiB \(downloads 1\.0 PiB \+ joining parts 1\.0 TiB\), .* free; free .* or choose another --save-path/,
    );
  });
});

describe("terminal progress", () => {
  it("draws a total bar and one bar per active file, then a line per finished file", () => {
    let out = "";
    const sink = Object.assign(
      new Writable({
        write(chunk, _enc, cb) {
          out += chunk.toString();
          cb();
        },
      }),
      { isTTY: true, columns: 120, rows: 40 },
    ) as unknown as NodeJS.WriteStream;
    const progress = createTransferProgress({ total: 3000, stream: sink });
    const a = progress.file("part_aa", 2000, 0);
    const b = progress.file("part_ab", 1000, 0);
    a.add(1000);
    b.add(500);
    a.done("downloaded, verified");
    progress.stop();
    expect(out).toMatch(
      /total\s+\[[█░]+\]\s+\d+% \| [\d.]+ KiB \/ 2\.9 KiB \| [\d.]+ [KM]iB\/s \| ETA [\d.]+ s/,
    );
    expect(out).toMatch(/part_ab\s+\[/);
    expect(out).toMatch(/part_aa: downloaded, verified/);
  });
});
