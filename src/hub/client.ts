import type { Readable } from "node:stream";
import got, { type Got, type Response } from "got";
import { CliError } from "../runtime/errors.js";
import { packageVersion } from "../runtime/package-root.js";
import { HubStatusError, retryNotice } from "./http-errors.js";
import { type RepoRef, resolveUrl, treeUrl } from "./repo.js";
import { type RetryPolicy, withRetries } from "./retry.js";

/** One file of a repository as the tree API lists it. */
export interface RemoteFile {
  path: string;
  size: number;
  /** Git blob sha1: the content hash of files stored in git itself. */
  gitOid: string;
  /** sha256 of the content, for files stored with LFS. */
  sha256?: string;
}

/** What a HEAD on a file's resolve URL says (huggingface_hub's HfFileMetadata). */
export interface FileMetadata {
  /** Where the bytes are: the storage URL a large file redirects to, else the resolve URL. */
  location: string;
  /** X-Linked-Size for LFS files, else Content-Length; checked against the tree's size. */
  size: number;
}

export interface HubClientOptions extends RetryPolicy {
  endpoint: string;
  token: string | null;
  /** Seconds to wait to connect, for headers, and between body bytes. */
  timeoutS: number;
  /** Told of each retry of a listing or metadata call as it is scheduled, in one line. */
  onRetry?: (message: string) => void;
}

interface TreeEntry {
  type: string;
  path: string;
  size: number;
  oid: string;
  lfs?: { oid: string; size: number };
}

function header(res: Response, name: string): string | undefined {
  const v = res.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

function statusError(res: Response): HubStatusError {
  let message = header(res, "x-error-message");
  if (!message && typeof res.body === "string" && res.body.length < 500) {
    message = res.body.trim() || undefined;
  }
  return new HubStatusError(res.statusCode, res.url, header(res, "x-error-code"), message);
}

/** The `rel="next"` target of a Link header, which the tree API uses for pagination. */
export function nextLink(link: string | undefined): string | undefined {
  for (const part of link?.split(",") ?? []) {
    const m = /<([^>]+)>\s*;\s*rel="?next"?/.exec(part);
    if (m) return m[1];
  }
  return undefined;
}

/** The calls a downloader makes to a Hugging Face-compatible hub, with retries. */
export class HubClient {
  private readonly http: Got;
  private readonly origin: string;

  constructor(readonly options: HubClientOptions) {
    this.origin = new URL(options.endpoint).origin;
    const ms = options.timeoutS * 1000;
    this.http = got.extend({
      retry: { limit: 0 },
      throwHttpErrors: false,
      followRedirect: false,
      decompress: false,
      timeout: { connect: ms, response: ms, socket: ms },
      headers: { "user-agent": `searchr1/${packageVersion()}; node/${process.versions.node}` },
    });
  }

  /** The retry callback for calls about `label`, announcing each retry through onRetry. */
  private announce(label: string) {
    return (err: unknown, waitMs: number, n: number) =>
      this.options.onRetry?.(
        retryNotice(err, n, waitMs, {
          label,
          endpoint: this.options.endpoint,
          retries: this.options.retries,
        }),
      );
  }

  get hasToken(): boolean {
    return this.options.token !== null;
  }

  /** The token goes to the hub only, never to the storage host a file redirects to. */
  private headers(url: string, extra: Record<string, string> = {}): Record<string, string> {
    const h = { ...extra };
    if (this.options.token && new URL(url).origin === this.origin) {
      h.authorization = `Bearer ${this.options.token}`;
    }
    return h;
  }

  /** Every file of the revision, following the tree API's pages. */
  async listFiles(repo: RepoRef, signal?: AbortSignal): Promise<RemoteFile[]> {
    const files: RemoteFile[] = [];
    let url: string | undefined = treeUrl(this.options.endpoint, repo);
    while (url) {
      const pageUrl: string = url;
      const res = await withRetries(
        async () => {
          const r = await this.http.get(pageUrl, {
            headers: this.headers(pageUrl),
            signal,
            followRedirect: true,
          });
          if (r.statusCode !== 200) throw statusError(r);
          return r;
        },
        this.options,
        signal,
        this.announce(`file list of ${repo.id}`),
      );
      let entries: TreeEntry[];
      try {
        entries = JSON.parse(res.body);
      } catch {
        throw new CliError(
          `${pageUrl}: the tree API answered something that is not JSON; is HF_ENDPOINT a Hugging Face-compatible hub?`,
          1,
        );
      }
      if (!Array.isArray(entries)) {
        throw new CliError(
          `${pageUrl}: the tree API answered JSON that is not a list of files; is HF_ENDPOINT a Hugging Face-compatible hub?`,
          1,
        );
      }
      for (const e of entries) {
        if (e.type !== "file") continue;
        files.push({ path: e.path, size: e.size, gitOid: e.oid, sha256: e.lfs?.oid });
      }
      url = nextLink(header(res, "link"));
    }
    return files;
  }

  /**
   * HEAD on the resolve URL. Relative redirects (a renamed repo) are followed; an absolute
   * one is where the bytes live and is returned as the location, as huggingface_hub does.
   */
  async metadata(repo: RepoRef, filePath: string, signal?: AbortSignal): Promise<FileMetadata> {
    return withRetries(
      async () => {
        let url = resolveUrl(this.options.endpoint, repo, filePath);
        for (let hop = 0; hop < 10; hop++) {
          const res = await this.http.head(url, {
            headers: this.headers(url, { "accept-encoding": "identity" }),
            signal,
          });
          const location = header(res, "location");
          const meta = () => ({
            size: Number(
              header(res, "x-linked-size") ?? header(res, "content-length") ?? Number.NaN,
            ),
          });
          if (res.statusCode >= 300 && res.statusCode < 400 && location) {
            const target = new URL(location, url).toString();
            if (location.startsWith("/")) {
              url = target;
              continue;
            }
            return { location: target, ...meta() };
          }
          if (res.statusCode !== 200) throw statusError(res);
          return { location: url, ...meta() };
        }
        throw new CliError(`${filePath}: too many redirects from ${this.options.endpoint}`, 1);
      },
      this.options,
      signal,
      this.announce(filePath),
    );
  }

  /** A small file's text (a model's config.json), from where metadata() says it lives. */
  async readText(repo: RepoRef, filePath: string, signal?: AbortSignal): Promise<string> {
    const { location } = await this.metadata(repo, filePath, signal);
    return withRetries(
      async () => {
        const res = await this.http.get(location, {
          headers: this.headers(location, { "accept-encoding": "identity" }),
          signal,
          followRedirect: true,
        });
        if (res.statusCode !== 200) throw statusError(res);
        return res.body;
      },
      this.options,
      signal,
      this.announce(filePath),
    );
  }

  /**
   * Opens bytes [start, end) of a file; resolves once the status is known so the caller
   * can read the body. Redirects from here on are followed (storage hosts may add some).
   */
  async openRange(url: string, start: number, end: number, signal: AbortSignal): Promise<Readable> {
    const stream = this.http.stream(url, {
      headers: this.headers(url, {
        "accept-encoding": "identity",
        range: `bytes=${start}-${end - 1}`,
      }),
      followRedirect: true,
      signal,
    });
    const res = await new Promise<Response>((resolve, reject) => {
      stream.once("response", resolve);
      stream.once("error", reject);
    });
    if (res.statusCode !== 206) {
      stream.destroy();
      if (res.statusCode === 200) this.unsupported(url);
      throw new HubStatusError(
        res.statusCode,
        url,
        header(res, "x-error-code"),
        header(res, "x-error-message"),
      );
    }
    const range = /bytes (\d+)-(\d+)\//.exec(header(res, "content-range") ?? "");
    if (!range || Number(range[1]) !== start || Number(range[2]) !== end - 1) {
      stream.destroy();
      throw new CliError(
        `${url}: asked for bytes ${start}-${end - 1}, got "${header(res, "content-range")}"`,
        1,
      );
    }
    return stream;
  }

  private unsupported(url: string): never {
    throw new CliError(
      `${new URL(url).host} ignores Range requests; searchr1 needs them to resume and split downloads`,
      1,
    );
  }
}
