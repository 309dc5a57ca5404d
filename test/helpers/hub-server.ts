/**
 * A local stand-in for the Hugging Face hub, for tests of `searchr1 download`.
 *
 * It serves the calls a downloader makes, with the real hub's URL layout and headers:
 * - `GET /api/{models|datasets}/<id>/tree/<revision>[/<path>]?recursive=true` (paginated, `Link`)
 * - `HEAD|GET /[datasets/]<id>/resolve/<revision>/<path>` (200 for plain files, 302 for LFS ones)
 * - `GET /storage/<sha256>` (LFS content, with `Range` support), on another host name
 *   (`127.0.0.1` rather than `localhost`), like the hub's CDN
 *
 * Faults (503s, dropped connections, throttling, corrupt bytes, slow headers) can be injected into
 * data responses: storage GETs and resolve GETs of non-LFS files.
 */
import { createHash } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { setTimeout as delay } from "node:timers/promises";

export interface HubFile {
  path: string;
  content: Buffer;
  lfs?: boolean;
  /** Size the tree API and X-Linked-Size claim instead of the real one (a huge file, for disk checks). */
  declaredSize?: number;
}

export interface HubRepo {
  /** "owner/name" */
  id: string;
  type: "model" | "dataset";
  /** Default "main"; only this revision exists (and the repo's commit sha, see {@link hubCommit}). */
  revision?: string;
  files: HubFile[];
  /** Needs "Authorization: Bearer <token>" equal to the server's `token`. */
  gated?: boolean;
}

export interface HubFaults {
  /**
   * Destroy the socket after this many body bytes of a data response (storage GET or non-LFS
   * resolve GET), for the next `dropTimes` data responses (default 1) whose body is longer than
   * that.
   */
  dropAfterBytes?: number;
  dropTimes?: number;
  /** The next N storage GETs answer 403, as a CDN does for an expired signed URL. */
  expiredStorage?: number;
  /** The next N data requests (storage GET / resolve GET, not tree, not HEAD) answer 503. */
  status503?: number;
  /** Throttle every data response body to this many bytes per second, per connection. */
  bytesPerSecond?: number;
  /** Serve this file path with one byte (at floor(size / 2)) XOR 0xff, in every data response. */
  corruptPath?: string;
  /** Delay before sending the response headers of data requests, ms. */
  headerDelayMs?: number;
}

export interface HubRequest {
  method: string;
  /** pathname + search, as received */
  path: string;
  range?: string;
  /** Status of the response headers (0 until they are sent). */
  status: number;
  authorization?: string;
  host?: string;
}

export interface HubServer {
  /** Endpoint as a client would configure HF_ENDPOINT, e.g. http://localhost:PORT */
  url: string;
  requests: HubRequest[];
  setFaults(f: HubFaults): void;
  close(): Promise<void>;
}

export interface HubServerOptions {
  repos: HubRepo[];
  token?: string;
  /** Tree API entries per page (default 1000). */
  pageSize?: number;
  faults?: HubFaults;
}

/** Git blob sha1 of content: sha1("blob " + length + "\0" + content), hex. */
export function gitBlobSha1(content: Buffer): string {
  return createHash("sha1").update(`blob ${content.length}\0`).update(content).digest("hex");
}

export function sha256Hex(content: Buffer): string {
  return createHash("sha256").update(content).digest("hex");
}

/** The fixed commit sha the server reports (X-Repo-Commit) for a repo. */
export function hubCommit(repo: Pick<HubRepo, "id" | "type" | "revision">): string {
  return createHash("sha1")
    .update(`commit ${repo.type}/${repo.id}@${repo.revision ?? "main"}`)
    .digest("hex");
}

/** The git-lfs pointer file that stands in the repo for an LFS file. */
export function lfsPointer(content: Buffer): Buffer {
  return Buffer.from(
    `version https://git-lfs.github.com/spec/v1\noid sha256:${sha256Hex(content)}\nsize ${content.length}\n`,
  );
}

interface FileInfo {
  path: string;
  content: Buffer;
  lfs: boolean;
  gitSha1: string;
  sha256: string;
  pointer?: Buffer;
  declaredSize?: number;
}

interface RepoInfo {
  repo: HubRepo;
  revision: string;
  commit: string;
  files: Map<string, FileInfo>;
  dirs: Set<string>;
}

type TreeEntry =
  | { type: "directory"; oid: string; size: 0; path: string }
  | {
      type: "file";
      oid: string;
      size: number;
      path: string;
      lfs?: { oid: string; size: number; pointerSize: number };
    };

interface ByteRange {
  start: number;
  /** inclusive */
  end: number;
}

/** `undefined`: no usable Range header (serve everything); "unsatisfiable": answer 416. */
function parseRange(
  header: string | undefined,
  total: number,
): ByteRange | "unsatisfiable" | undefined {
  if (header === undefined) return undefined;
  const m = /^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$/i.exec(header);
  if (!m) return undefined;
  const [, a = "", b = ""] = m;
  if (a === "" && b === "") return undefined;
  if (a === "") {
    const n = Number(b);
    if (n === 0 || total === 0) return "unsatisfiable";
    return { start: Math.max(0, total - n), end: total - 1 };
  }
  const start = Number(a);
  if (b !== "" && Number(b) < start) return undefined;
  if (start >= total) return "unsatisfiable";
  const end = b === "" ? total - 1 : Math.min(Number(b), total - 1);
  return { start, end };
}

function decodeSegment(s: string): string | undefined {
  try {
    return decodeURIComponent(s);
  } catch {
    return undefined;
  }
}

/** Sleeps; false when aborted (client gone or server closing). */
async function sleep(ms: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return false;
  if (ms <= 0) return true;
  try {
    await delay(ms, undefined, { signal });
    return true;
  } catch {
    return false;
  }
}

/** Writes a chunk and waits until it is handed to the socket; false when the client is gone. */
function writeChunk(res: ServerResponse, chunk: Buffer, signal: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal.aborted || res.destroyed) {
      resolve(false);
      return;
    }
    const onAbort = () => resolve(false);
    signal.addEventListener("abort", onAbort, { once: true });
    res.write(chunk, (err) => {
      signal.removeEventListener("abort", onAbort);
      resolve(!err);
    });
  });
}

const JSON_TYPE = "application/json; charset=utf-8";
const OCTET_TYPE = "application/octet-stream";

export async function createHubServer(opts: HubServerOptions): Promise<HubServer> {
  const token = opts.token;
  const pageSize = Math.max(1, opts.pageSize ?? 1000);
  const requests: HubRequest[] = [];

  const repos = new Map<string, RepoInfo>();
  /** sha256 → LFS files with that content (several paths may share it) */
  const blobs = new Map<string, FileInfo[]>();
  for (const repo of opts.repos) {
    const files = new Map<string, FileInfo>();
    const dirs = new Set<string>();
    for (const f of repo.files) {
      const lfs = f.lfs === true;
      const pointer = lfs ? lfsPointer(f.content) : undefined;
      const info: FileInfo = {
        path: f.path,
        content: f.content,
        lfs,
        gitSha1: gitBlobSha1(pointer ?? f.content),
        sha256: sha256Hex(f.content),
        pointer,
        declaredSize: f.declaredSize,
      };
      files.set(f.path, info);
      const parts = f.path.split("/");
      for (let i = 1; i < parts.length; i++) dirs.add(parts.slice(0, i).join("/"));
      if (lfs) {
        const list = blobs.get(info.sha256) ?? [];
        list.push(info);
        blobs.set(info.sha256, list);
      }
    }
    repos.set(`${repo.type}:${repo.id}`, {
      repo,
      revision: repo.revision ?? "main",
      commit: hubCommit(repo),
      files,
      dirs,
    });
  }

  let faults: HubFaults = {};
  let drops = 0;
  let fails503 = 0;
  let expired = 0;
  const setFaults = (f: HubFaults) => {
    faults = { ...f };
    expired = f.expiredStorage ?? 0;
    drops = f.dropAfterBytes === undefined ? 0 : (f.dropTimes ?? 1);
    fails503 = f.status503 ?? 0;
  };
  setFaults(opts.faults ?? {});

  let port = 0;
  const active = new Set<AbortController>();

  const head = (
    res: ServerResponse,
    record: HubRequest,
    status: number,
    headers: Record<string, string | number>,
  ) => {
    record.status = status;
    res.writeHead(status, headers);
  };

  const sendJson = (
    req: IncomingMessage,
    res: ServerResponse,
    record: HubRequest,
    status: number,
    body: unknown,
    headers: Record<string, string | number> = {},
  ) => {
    const text = Buffer.from(JSON.stringify(body));
    head(res, record, status, {
      "Content-Type": JSON_TYPE,
      "Content-Length": text.length,
      ...headers,
    });
    res.end(req.method === "HEAD" ? undefined : text);
  };

  const sendError = (
    req: IncomingMessage,
    res: ServerResponse,
    record: HubRequest,
    status: number,
    code: string | undefined,
    message: string,
  ) => {
    const headers: Record<string, string> = { "X-Error-Message": message };
    if (code !== undefined) headers["X-Error-Code"] = code;
    sendJson(req, res, record, status, { error: message }, headers);
  };

  /** Checks repo, access and revision; answers the error and returns undefined when one fails. */
  const openRepo = (
    req: IncomingMessage,
    res: ServerResponse,
    record: HubRequest,
    type: "model" | "dataset",
    id: string,
    revision: string,
  ): RepoInfo | undefined => {
    const info = repos.get(`${type}:${id}`);
    if (!info) {
      sendError(
        req,
        res,
        record,
        401,
        "RepoNotFound",
        `Repository Not Found for url: http://localhost:${port}${req.url ?? ""}.`,
      );
      return undefined;
    }
    if (
      info.repo.gated &&
      (token === undefined || req.headers.authorization !== `Bearer ${token}`)
    ) {
      sendError(
        req,
        res,
        record,
        401,
        "GatedRepo",
        `Access to ${type} ${id} is restricted. You must have access to it and be authenticated to access it. Please log in.`,
      );
      return undefined;
    }
    if (revision !== info.revision && revision !== info.commit) {
      sendError(req, res, record, 404, "RevisionNotFound", `Invalid rev id: ${revision}`);
      return undefined;
    }
    return info;
  };

  const treeEntries = (info: RepoInfo, dir: string, recursive: boolean): TreeEntry[] => {
    const prefix = dir === "" ? "" : `${dir}/`;
    const wanted = (p: string) =>
      p.startsWith(prefix) && (recursive || !p.slice(prefix.length).includes("/"));
    const entries: TreeEntry[] = [];
    for (const d of info.dirs) {
      if (!wanted(d)) continue;
      entries.push({
        type: "directory",
        oid: createHash("sha1").update(`tree ${info.commit} ${d}`).digest("hex"),
        size: 0,
        path: d,
      });
    }
    for (const f of info.files.values()) {
      if (!wanted(f.path)) continue;
      entries.push({
        type: "file",
        oid: f.gitSha1,
        size: f.declaredSize ?? f.content.length,
        path: f.path,
        ...(f.pointer
          ? {
              lfs: {
                oid: f.sha256,
                size: f.declaredSize ?? f.content.length,
                pointerSize: f.pointer.length,
              },
            }
          : {}),
      });
    }
    return entries.sort((x, y) => (x.path < y.path ? -1 : x.path > y.path ? 1 : 0));
  };

  const handleTree = (
    req: IncomingMessage,
    res: ServerResponse,
    record: HubRequest,
    url: URL,
    segs: string[],
  ) => {
    // segs: ["api", "models"|"datasets", ...id, "tree", revision, ...path]
    const kind = segs[1];
    const treeAt = segs.indexOf("tree", 3);
    if ((kind !== "models" && kind !== "datasets") || treeAt < 0 || treeAt + 1 >= segs.length) {
      return notFound(req, res, record);
    }
    const decoded = segs.slice(2).map(decodeSegment);
    if (decoded.some((s) => s === undefined)) return notFound(req, res, record);
    const parts = decoded as string[];
    const id = parts.slice(0, treeAt - 2).join("/");
    const revision = parts[treeAt - 1] as string;
    const dir = parts
      .slice(treeAt)
      .filter((s) => s !== "")
      .join("/");
    const info = openRepo(req, res, record, kind === "models" ? "model" : "dataset", id, revision);
    if (!info) return;
    if (dir !== "" && !info.dirs.has(dir)) {
      return sendError(req, res, record, 404, "EntryNotFound", "Entry not found");
    }
    const recursiveParam = (url.searchParams.get("recursive") ?? "").toLowerCase();
    const recursive = recursiveParam === "true" || recursiveParam === "1";
    const entries = treeEntries(info, dir, recursive);

    let offset = 0;
    const cursor = url.searchParams.get("cursor");
    if (cursor !== null) {
      const parsed = Number(Buffer.from(cursor, "base64url").toString("utf8").replace(/^off:/, ""));
      if (!Number.isInteger(parsed) || parsed < 0 || parsed > entries.length) {
        return sendError(req, res, record, 400, undefined, "Invalid cursor");
      }
      offset = parsed;
    }
    const page = entries.slice(offset, offset + pageSize);
    const headers: Record<string, string> = {};
    if (offset + pageSize < entries.length) {
      const next = new URL(url.pathname, `http://localhost:${port}`);
      for (const [k, v] of url.searchParams) if (k !== "cursor") next.searchParams.append(k, v);
      next.searchParams.set(
        "cursor",
        Buffer.from(`off:${offset + pageSize}`, "utf8").toString("base64url"),
      );
      headers.Link = `<${next.href}>; rel="next"`;
    }
    sendJson(req, res, record, 200, page, headers);
  };

  /** Serves file bytes (storage GET or non-LFS resolve GET), with Range and faults. */
  const sendData = async (
    req: IncomingMessage,
    res: ServerResponse,
    record: HubRequest,
    file: FileInfo,
    corruptible: boolean,
    headers: Record<string, string | number>,
    signal: AbortSignal,
  ) => {
    if (fails503 > 0) {
      fails503--;
      const body = Buffer.from("Service Unavailable");
      head(res, record, 503, { "Content-Type": "text/plain", "Content-Length": body.length });
      res.end(body);
      return;
    }
    const f = faults;
    if (f.headerDelayMs !== undefined && !(await sleep(f.headerDelayMs, signal))) {
      res.destroy();
      return;
    }
    const total = file.content.length;
    const range = parseRange(req.headers.range, total);
    if (range === "unsatisfiable") {
      head(res, record, 416, {
        ...headers,
        "Content-Range": `bytes */${total}`,
        "Content-Length": 0,
      });
      res.end();
      return;
    }
    const start = range?.start ?? 0;
    const end = range?.end ?? total - 1;
    let body = file.content.subarray(start, end + 1);
    if (corruptible) {
      const at = Math.floor(total / 2);
      if (at >= start && at <= end && total > 0) {
        body = Buffer.from(body);
        body[at - start] = (body[at - start] as number) ^ 0xff;
      }
    }
    head(res, record, range ? 206 : 200, {
      ...headers,
      "Content-Length": body.length,
      ...(range ? { "Content-Range": `bytes ${start}-${end}/${total}` } : {}),
    });

    let limit = body.length;
    let drop = false;
    if (f.dropAfterBytes !== undefined && drops > 0 && body.length > f.dropAfterBytes) {
      drops--;
      drop = true;
      limit = Math.max(0, f.dropAfterBytes);
    }
    const bps = f.bytesPerSecond !== undefined && f.bytesPerSecond > 0 ? f.bytesPerSecond : 0;
    const slice = bps > 0 ? Math.max(1, Math.min(64 * 1024, Math.floor(bps / 20))) : 1 << 20;
    const t0 = Date.now();
    let sent = 0;
    while (sent < limit) {
      if (bps > 0 && !(await sleep(t0 + (sent / bps) * 1000 - Date.now(), signal))) {
        res.destroy();
        return;
      }
      const n = Math.min(slice, limit - sent);
      if (!(await writeChunk(res, body.subarray(sent, sent + n), signal))) {
        res.destroy();
        return;
      }
      sent += n;
    }
    if (drop) {
      // Headers and the bytes written so far reach the client, then the connection is cut.
      res.flushHeaders();
      const socket = res.socket;
      if (!socket || socket.destroyed) return;
      // A client that stops reading does not delay the cut for long.
      const timer = setTimeout(() => socket.destroy(), 1000);
      socket.once("close", () => clearTimeout(timer));
      socket.end(() => socket.destroy());
      return;
    }
    res.end();
  };

  const handleResolve = async (
    req: IncomingMessage,
    res: ServerResponse,
    record: HubRequest,
    segs: string[],
    signal: AbortSignal,
  ) => {
    const type = segs[0] === "datasets" ? "dataset" : "model";
    const rest = type === "dataset" ? segs.slice(1) : segs;
    const at = rest.indexOf("resolve", 1);
    if (at < 0 || at + 2 >= rest.length) return notFound(req, res, record);
    const decoded = rest.map(decodeSegment);
    if (decoded.some((s) => s === undefined)) return notFound(req, res, record);
    const parts = decoded as string[];
    const id = parts.slice(0, at).join("/");
    const revision = parts[at + 1] as string;
    const path = parts.slice(at + 2).join("/");
    const info = openRepo(req, res, record, type, id, revision);
    if (!info) return;
    const file = info.files.get(path);
    if (!file) return sendError(req, res, record, 404, "EntryNotFound", "Entry not found");

    if (file.lfs) {
      const expires = Math.floor(Date.now() / 1000) + 3600;
      head(res, record, 302, {
        Location: `http://127.0.0.1:${port}/storage/${file.sha256}?expires=${expires}`,
        "X-Linked-Etag": `"${file.sha256}"`,
        "X-Linked-Size": file.declaredSize ?? file.content.length,
        ETag: `"${file.sha256}"`,
        "X-Repo-Commit": info.commit,
        "Content-Length": 0,
      });
      res.end();
      return;
    }
    const headers = {
      ETag: `"${file.gitSha1}"`,
      "X-Repo-Commit": info.commit,
      "Accept-Ranges": "bytes",
      "Content-Type": OCTET_TYPE,
    };
    if (req.method === "HEAD") {
      head(res, record, 200, { ...headers, "Content-Length": file.content.length });
      res.end();
      return;
    }
    await sendData(req, res, record, file, faults.corruptPath === file.path, headers, signal);
  };

  const handleStorage = async (
    req: IncomingMessage,
    res: ServerResponse,
    record: HubRequest,
    segs: string[],
    signal: AbortSignal,
  ) => {
    const sha = segs[1] ?? "";
    const list = segs.length === 2 ? blobs.get(sha) : undefined;
    const file = list?.[0];
    if (!list || !file) return notFound(req, res, record);
    const headers = {
      ETag: `"${file.sha256}"`,
      "Accept-Ranges": "bytes",
      "Content-Type": OCTET_TYPE,
    };
    if (req.method === "HEAD") {
      head(res, record, 200, { ...headers, "Content-Length": file.content.length });
      res.end();
      return;
    }
    if (expired > 0) {
      expired--;
      const body = Buffer.from(
        "<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>",
      );
      head(res, record, 403, { "Content-Type": "application/xml", "Content-Length": body.length });
      res.end(body);
      return;
    }
    const corrupt =
      faults.corruptPath !== undefined && list.some((x) => x.path === faults.corruptPath);
    await sendData(req, res, record, file, corrupt, headers, signal);
  };

  const notFound = (req: IncomingMessage, res: ServerResponse, record: HubRequest) => {
    sendError(req, res, record, 404, undefined, "Not Found");
  };

  const route = async (
    req: IncomingMessage,
    res: ServerResponse,
    record: HubRequest,
    signal: AbortSignal,
  ) => {
    const url = new URL(req.url ?? "/", `http://localhost:${port}`);
    const segs = url.pathname.split("/").slice(1);
    const method = req.method ?? "GET";
    if (method !== "GET" && method !== "HEAD") return notFound(req, res, record);
    if (segs[0] === "api") return handleTree(req, res, record, url, segs);
    if (segs[0] === "storage") return handleStorage(req, res, record, segs, signal);
    if (segs.includes("resolve")) return handleResolve(req, res, record, segs, signal);
    return notFound(req, res, record);
  };

  const onRequest = (req: IncomingMessage, res: ServerResponse) => {
    const record: HubRequest = {
      method: req.method ?? "GET",
      path: req.url ?? "/",
      range: req.headers.range,
      status: 0,
      authorization: req.headers.authorization,
      host: req.headers.host,
    };
    requests.push(record);
    const ac = new AbortController();
    active.add(ac);
    res.on("close", () => {
      ac.abort();
      active.delete(ac);
    });
    res.on("error", () => {});
    req.on("error", () => {});
    route(req, res, record, ac.signal).catch(() => {
      if (!res.headersSent && !res.destroyed) {
        sendError(req, res, record, 500, undefined, "Internal Error");
      } else {
        res.destroy();
      }
    });
  };

  const servers: Server[] = [];
  const listen = (server: Server, host: string, p: number) =>
    new Promise<number>((resolve, reject) => {
      server.once("error", reject);
      server.listen(p, host, () => {
        server.off("error", reject);
        resolve((server.address() as AddressInfo).port);
      });
    });

  const v4 = createServer(onRequest);
  port = await listen(v4, "127.0.0.1", 0);
  servers.push(v4);
  // "localhost" may resolve to ::1 first on some systems: answer there too when we can.
  const v6 = createServer(onRequest);
  try {
    await listen(v6, "::1", port);
    servers.push(v6);
  } catch {
    v6.close();
  }

  let closed: Promise<void> | undefined;
  return {
    url: `http://localhost:${port}`,
    requests,
    setFaults,
    close() {
      closed ??= (async () => {
        for (const ac of active) ac.abort();
        active.clear();
        await Promise.all(
          servers.map(
            (s) =>
              new Promise<void>((resolve) => {
                s.close(() => resolve());
                s.closeAllConnections();
              }),
          ),
        );
      })();
      return closed;
    },
  };
}
