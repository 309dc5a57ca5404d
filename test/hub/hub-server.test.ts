import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import {
  createHubServer,
  gitBlobSha1,
  type HubRepo,
  type HubServer,
  hubCommit,
  sha256Hex,
} from "../helpers/hub-server.js";

const big = Buffer.alloc(300 * 1024);
for (let i = 0; i < big.length; i++) big[i] = (i * 7919 + (i >> 8)) & 0xff;
const config = Buffer.from('{"name": "tiny"}\n');
const notes = Buffer.from("some notes\n");
const weights = Buffer.from("pretend safetensors");

const dataset: HubRepo = {
  id: "acme/tiny-data",
  type: "dataset",
  files: [
    { path: "data/train.parquet", content: big, lfs: true },
    { path: "config.json", content: config },
    { path: "sub/dir/notes.txt", content: notes },
  ],
};
const model: HubRepo = {
  id: "acme/gated-model",
  type: "model",
  gated: true,
  files: [
    { path: "model.safetensors", content: weights, lfs: true },
    { path: "config.json", content: config },
  ],
};
const TOKEN = "hf_test_token";
const bigSha = sha256Hex(big);

/** Reads a body until it ends or fails; returns the bytes received and whether it failed. */
async function readAll(res: Response): Promise<{ bytes: Buffer; failed: boolean }> {
  const chunks: Buffer[] = [];
  const reader = (res.body as ReadableStream<Uint8Array>).getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(Buffer.from(value));
    }
    return { bytes: Buffer.concat(chunks), failed: false };
  } catch {
    return { bytes: Buffer.concat(chunks), failed: true };
  }
}

describe("hub server", () => {
  let hub: HubServer;
  let storage: string;

  beforeAll(async () => {
    hub = await createHubServer({ repos: [dataset, model], token: TOKEN, pageSize: 2 });
    storage = `${hub.url.replace("localhost", "127.0.0.1")}/storage/${bigSha}`;
  });
  afterAll(async () => {
    await hub.close();
  });
  beforeEach(() => {
    hub.setFaults({});
    hub.requests.length = 0;
  });

  it("hashes like git and git-lfs", () => {
    expect(gitBlobSha1(Buffer.from("hello\n"))).toBe("ce013625030ba8dba906f756967f9e9ca394464a");
    expect(sha256Hex(Buffer.from("hello\n"))).toBe(
      "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03",
    );
    expect(hub.url).toMatch(/^http:\/\/localhost:\d+$/);
  });

  it("lists the tree recursively across pages", async () => {
    const entries: Array<Record<string, unknown>> = [];
    const links: string[] = [];
    let next: string | undefined =
      `${hub.url}/api/datasets/acme/tiny-data/tree/main?recursive=true`;
    while (next) {
      const res: Response = await fetch(next);
      expect(res.status).toBe(200);
      expect(res.headers.get("content-type")).toMatch(/^application\/json/);
      entries.push(...((await res.json()) as Array<Record<string, unknown>>));
      const link = res.headers.get("link");
      next = link ? /<([^>]+)>;\s*rel="next"/.exec(link)?.[1] : undefined;
      if (next) links.push(next);
    }
    expect(links).toHaveLength(2);
    for (const l of links) {
      expect(l).toMatch(/^http:\/\/localhost:\d+\/api\/datasets\/acme\/tiny-data\/tree\/main\?/);
      expect(l).toContain("recursive=true");
      expect(l).toContain("cursor=");
    }
    const byPath = new Map(entries.map((e) => [e.path as string, e]));
    expect([...byPath.keys()].sort()).toEqual([
      "config.json",
      "data",
      "data/train.parquet",
      "sub",
      "sub/dir",
      "sub/dir/notes.txt",
    ]);
    expect(byPath.get("config.json")).toEqual({
      type: "file",
      oid: gitBlobSha1(config),
      size: config.length,
      path: "config.json",
    });
    const lfs = byPath.get("data/train.parquet") as Record<string, unknown>;
    expect(lfs.type).toBe("file");
    expect(lfs.size).toBe(big.length);
    expect(lfs.oid).toMatch(/^[0-9a-f]{40}$/);
    expect(lfs.lfs).toMatchObject({ oid: bigSha, size: big.length });
    expect(byPath.get("sub/dir")).toMatchObject({ type: "directory", size: 0 });

    const top = await fetch(
      `${hub.url}/api/datasets/acme/tiny-data/tree/${encodeURIComponent("main")}`,
    );
    const topEntries = (await top.json()) as Array<{ path: string }>;
    expect(topEntries.map((e) => e.path)).toEqual(["config.json", "data"]);
  });

  it("answers HEAD on resolve like the hub", async () => {
    const lfs = await fetch(`${hub.url}/datasets/acme/tiny-data/resolve/main/data/train.parquet`, {
      method: "HEAD",
      redirect: "manual",
    });
    expect(lfs.status).toBe(302);
    const port = new URL(hub.url).port;
    expect(lfs.headers.get("location")).toMatch(
      new RegExp(`^http://127\\.0\\.0\\.1:${port}/storage/${bigSha}\\?expires=\\d+$`),
    );
    expect(lfs.headers.get("x-linked-etag")).toBe(`"${bigSha}"`);
    expect(lfs.headers.get("x-linked-size")).toBe(String(big.length));
    expect(lfs.headers.get("etag")).toBe(`"${bigSha}"`);
    expect(lfs.headers.get("x-repo-commit")).toBe(hubCommit(dataset));
    expect(hubCommit(dataset)).toMatch(/^[0-9a-f]{40}$/);

    const plain = await fetch(`${hub.url}/datasets/acme/tiny-data/resolve/main/sub/dir/notes.txt`, {
      method: "HEAD",
    });
    expect(plain.status).toBe(200);
    expect(plain.headers.get("etag")).toBe(`"${gitBlobSha1(notes)}"`);
    expect(plain.headers.get("content-length")).toBe(String(notes.length));
    expect(plain.headers.get("accept-ranges")).toBe("bytes");
    expect(plain.headers.get("x-repo-commit")).toBe(hubCommit(dataset));
  });

  it("follows the LFS redirect to another host and serves plain files", async () => {
    const res = await fetch(`${hub.url}/datasets/acme/tiny-data/resolve/main/data/train.parquet`);
    expect(res.status).toBe(200);
    expect(Buffer.from(await res.arrayBuffer()).equals(big)).toBe(true);
    const storageReq = hub.requests.find((r) => r.path.startsWith("/storage/"));
    expect(storageReq?.host).toMatch(/^127\.0\.0\.1:\d+$/);
    expect(hub.requests[0]).toMatchObject({ method: "GET", status: 302 });

    const plain = await fetch(`${hub.url}/datasets/acme/tiny-data/resolve/main/config.json`);
    expect(Buffer.from(await plain.arrayBuffer()).equals(config)).toBe(true);
    const ranged = await fetch(`${hub.url}/datasets/acme/tiny-data/resolve/main/config.json`, {
      headers: { Range: "bytes=2-5" },
    });
    expect(ranged.status).toBe(206);
    expect(await ranged.text()).toBe(config.subarray(2, 6).toString());
  });

  it("serves byte ranges from storage", async () => {
    const res = await fetch(storage, { headers: { Range: "bytes=1000-1999" } });
    expect(res.status).toBe(206);
    expect(res.headers.get("content-range")).toBe(`bytes 1000-1999/${big.length}`);
    expect(res.headers.get("content-length")).toBe("1000");
    expect(res.headers.get("etag")).toBe(`"${bigSha}"`);
    expect(Buffer.from(await res.arrayBuffer()).equals(big.subarray(1000, 2000))).toBe(true);

    const open = await fetch(storage, { headers: { Range: `bytes=${big.length - 10}-` } });
    expect(open.status).toBe(206);
    expect(open.headers.get("content-range")).toBe(
      `bytes ${big.length - 10}-${big.length - 1}/${big.length}`,
    );
    expect(Buffer.from(await open.arrayBuffer()).equals(big.subarray(big.length - 10))).toBe(true);

    const bad = await fetch(storage, { headers: { Range: `bytes=${big.length}-` } });
    expect(bad.status).toBe(416);
    expect(bad.headers.get("content-range")).toBe(`bytes */${big.length}`);
    await bad.arrayBuffer();
    expect(hub.requests.map((r) => r.range)).toEqual([
      "bytes=1000-1999",
      `bytes=${big.length - 10}-`,
      `bytes=${big.length}-`,
    ]);
  });

  it("answers the hub's error codes", async () => {
    const check = async (url: string, status: number, code: string, init?: RequestInit) => {
      const res = await fetch(url, { redirect: "manual", ...init });
      expect(res.status).toBe(status);
      expect(res.headers.get("x-error-code")).toBe(code);
      const body = (await res.json()) as { error: string };
      expect(body.error).toBe(res.headers.get("x-error-message"));
      return body.error;
    };
    expect(
      await check(`${hub.url}/datasets/acme/nope/resolve/main/x`, 401, "RepoNotFound"),
    ).toMatch(/^Repository Not Found for url: /);
    expect(await check(`${hub.url}/acme/tiny-data/resolve/main/config.json`, 401, "RepoNotFound"));
    expect(
      await check(`${hub.url}/acme/gated-model/resolve/main/config.json`, 401, "GatedRepo"),
    ).toBe(
      "Access to model acme/gated-model is restricted. You must have access to it and be authenticated to access it. Please log in.",
    );
    await check(`${hub.url}/acme/gated-model/resolve/main/config.json`, 401, "GatedRepo", {
      headers: { Authorization: "Bearer wrong" },
    });
    await check(
      `${hub.url}/api/models/acme/gated-model/tree/main?recursive=true`,
      401,
      "GatedRepo",
    );
    expect(
      await check(
        `${hub.url}/datasets/acme/tiny-data/resolve/v2/config.json`,
        404,
        "RevisionNotFound",
      ),
    ).toBe("Invalid rev id: v2");
    await check(`${hub.url}/api/datasets/acme/tiny-data/tree/v2`, 404, "RevisionNotFound");
    await check(
      `${hub.url}/datasets/acme/tiny-data/resolve/main/missing.txt`,
      404,
      "EntryNotFound",
    );

    const auth = { Authorization: `Bearer ${TOKEN}` };
    const ok = await fetch(`${hub.url}/acme/gated-model/resolve/main/model.safetensors`, {
      headers: auth,
    });
    expect(ok.status).toBe(200);
    expect(Buffer.from(await ok.arrayBuffer()).equals(weights)).toBe(true);
    expect(hub.requests.at(-2)?.authorization).toBe(`Bearer ${TOKEN}`);
    const tree = await fetch(`${hub.url}/api/models/acme/gated-model/tree/main`, { headers: auth });
    expect(tree.status).toBe(200);
    await tree.arrayBuffer();

    const other = await fetch(`${hub.url}/whatever`);
    expect(other.status).toBe(404);
    await other.arrayBuffer();
  });

  it("injects 503s into data requests only", async () => {
    hub.setFaults({ status503: 2 });
    const head = await fetch(storage, { method: "HEAD" });
    expect(head.status).toBe(200);
    const statuses: number[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await fetch(`${hub.url}/datasets/acme/tiny-data/resolve/main/config.json`);
      statuses.push(res.status);
      await res.arrayBuffer();
    }
    expect(statuses).toEqual([503, 503, 200]);
  });

  it("drops connections after some bytes", async () => {
    hub.setFaults({ dropAfterBytes: 1000 });
    const first = await fetch(storage);
    expect(first.status).toBe(200);
    const cut = await readAll(first);
    expect(cut.failed).toBe(true);
    expect(cut.bytes.length).toBe(1000);
    expect(cut.bytes.equals(big.subarray(0, 1000))).toBe(true);

    const second = await readAll(await fetch(storage));
    expect(second.failed).toBe(false);
    expect(second.bytes.equals(big)).toBe(true);
  });

  it("corrupts one byte of a path in every covering response", async () => {
    hub.setFaults({ corruptPath: "data/train.parquet" });
    const mid = Math.floor(big.length / 2);
    const full = Buffer.from(await (await fetch(storage)).arrayBuffer());
    expect(full.length).toBe(big.length);
    expect(full[mid]).toBe((big[mid] as number) ^ 0xff);
    full[mid] = big[mid] as number;
    expect(full.equals(big)).toBe(true);

    const part = await fetch(storage, { headers: { Range: `bytes=${mid - 1}-${mid + 1}` } });
    expect([...Buffer.from(await part.arrayBuffer())]).toEqual([
      big[mid - 1],
      (big[mid] as number) ^ 0xff,
      big[mid + 1],
    ]);
    const before = await fetch(storage, { headers: { Range: "bytes=0-99" } });
    expect(Buffer.from(await before.arrayBuffer()).equals(big.subarray(0, 100))).toBe(true);
  });

  it("throttles and delays data responses, and closes with them in flight", async () => {
    hub.setFaults({ bytesPerSecond: 20_000, headerDelayMs: 50 });
    const t0 = Date.now();
    const res = await fetch(storage, { headers: { Range: "bytes=0-3999" } });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(45);
    expect(Buffer.from(await res.arrayBuffer()).equals(big.subarray(0, 4000))).toBe(true);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(190);

    // A slow response the client abandons, and one still running when the server closes.
    const ac = new AbortController();
    const abandoned = await fetch(storage, { signal: ac.signal });
    ac.abort();
    await readAll(abandoned);
    const other = await createHubServer({ repos: [dataset], faults: { bytesPerSecond: 10_000 } });
    const slow = await fetch(
      `${other.url}/datasets/acme/tiny-data/resolve/main/data/train.parquet`,
    );
    expect(slow.status).toBe(200);
    const pending = readAll(slow);
    await other.close();
    const result = await pending;
    expect(result.failed).toBe(true);
    expect(result.bytes.length).toBeLessThan(big.length);
  });
});
