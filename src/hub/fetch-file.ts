import { setMaxListeners } from "node:events";
import { mkdir, open, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import type { HubClient, RemoteFile } from "./client.js";
import { contentHash, expectedDigest, hashPrefix } from "./digest.js";
import { HubStatusError, IntegrityError, retryNotice } from "./http-errors.js";
import { type Piece, PieceWriter, splitPieces } from "./piece-writer.js";
import type { RepoRef } from "./repo.js";
import { withRetries } from "./retry.js";

export interface FileTransfer {
  repo: RepoRef;
  remote: RemoteFile;
  /** Final path; bytes go to `<dest>.incomplete` until they are verified. */
  dest: string;
}

export interface TransferSettings {
  /** Parallel range requests for one file. */
  connections: number;
  /** Size of each range request when a file is split. */
  pieceBytes: number;
}

export interface TransferEvents {
  onBytes?(bytes: number): void;
  onRetry?(message: string): void;
}

export interface TransferResult {
  resumedFrom: number;
}

export function partialPath(dest: string): string {
  return `${dest}.incomplete`;
}

/**
 * Where a file's bytes are. A storage host's signed URL can expire during a long download;
 * its refusal then means: ask the hub again (a retry), not: access denied.
 */
class Location {
  private refreshing: Promise<void> | undefined;

  constructor(
    private readonly client: HubClient,
    private readonly repo: RepoRef,
    private readonly filePath: string,
    public url: string,
  ) {}

  private get onStorageHost(): boolean {
    return new URL(this.url).origin !== new URL(this.client.options.endpoint).origin;
  }

  /** Opens a range; a 403/410 from the storage host renews the URL and fails as retryable. */
  async open(start: number, end: number, signal: AbortSignal) {
    const url = this.url;
    try {
      return await this.client.openRange(url, start, end, signal);
    } catch (err) {
      const expired =
        err instanceof HubStatusError &&
        (err.status === 403 || err.status === 410) &&
        this.onStorageHost;
      if (!expired) throw err;
      if (this.url === url) {
        this.refreshing ??= this.client.metadata(this.repo, this.filePath, signal).then((m) => {
          this.url = m.location;
          this.refreshing = undefined;
        });
        await this.refreshing;
      }
      throw Object.assign(new Error(`${err.message}: the storage URL expired, renewed it`), {
        code: "ERR_LOCATION_EXPIRED",
      });
    }
  }
}

function shortBody(piece: Piece): Error {
  const err = new Error(`body ended at byte ${piece.start + piece.received} of ${piece.end}`);
  return Object.assign(err, { code: "ERR_BODY_SHORT" });
}

const MIN_SPLIT_PIECE = 1 << 20;

/**
 * Range size for what is left of a file: one request when it fits in a piece; else pieces of
 * `pieceBytes`, smaller (down to 1 MiB) when that keeps every connection busy.
 */
export function pieceSize(remaining: number, settings: TransferSettings): number {
  if (settings.connections <= 1 || remaining <= settings.pieceBytes) return Math.max(remaining, 1);
  const spread = Math.max(Math.ceil(remaining / settings.connections), MIN_SPLIT_PIECE);
  return Math.min(settings.pieceBytes, spread);
}

/**
 * Fetches one file: resumes `<dest>.incomplete` from its size, splits what is left into
 * parallel range requests, hashes while writing, and renames only when the hash matches
 * the hub's. On failure or interruption the partial file stays for the next run.
 */
export async function fetchFile(
  client: HubClient,
  job: FileTransfer,
  settings: TransferSettings,
  signal: AbortSignal,
  events: TransferEvents = {},
): Promise<TransferResult> {
  const { remote } = job;
  const partial = partialPath(job.dest);
  await mkdir(path.dirname(job.dest), { recursive: true });
  const meta = await client.metadata(job.repo, remote.path, signal);
  if (Number.isFinite(meta.size) && meta.size !== remote.size) {
    throw new Error(
      `${remote.path}: the tree lists ${remote.size} bytes but the file is ${meta.size}; the revision changed meanwhile, run again`,
    );
  }
  const digest = expectedDigest(remote);
  const hash = contentHash(digest, remote.size);
  let have = (await stat(partial).catch(() => undefined))?.size ?? 0;
  if (have > remote.size) {
    await rm(partial);
    have = 0;
  }
  await hashPrefix(partial, hash, have, signal);

  const file = await open(partial, have > 0 ? "r+" : "w");
  try {
    if (have < remote.size) {
      const pieces = splitPieces(have, remote.size, pieceSize(remote.size - have, settings));
      const writer = new PieceWriter(file, hash, pieces, have);
      await fetchPieces(
        client,
        new Location(client, job.repo, remote.path, meta.location),
        pieces,
        writer,
        settings,
        signal,
        events,
        remote.path,
      );
    }
  } finally {
    await file.close();
  }

  const actual = hash.digest("hex");
  if (actual !== digest.hex) {
    await rm(partial, { force: true });
    throw new IntegrityError(
      `${remote.path}: ${digest.algorithm} mismatch (expected ${digest.hex}, got ${actual}); the corrupt download was removed, run again to fetch it anew`,
    );
  }
  await rename(partial, job.dest);
  return { resumedFrom: have };
}

async function fetchPieces(
  client: HubClient,
  location: Location,
  pieces: Piece[],
  writer: PieceWriter,
  settings: TransferSettings,
  outer: AbortSignal,
  events: TransferEvents,
  label: string,
): Promise<void> {
  // One failing piece stops the others; the outer signal (Ctrl-C) stops all.
  const local = new AbortController();
  // Every request and window wait listens to it; more than Node's default of 10 is expected.
  setMaxListeners(4 * settings.connections + 16, local.signal);
  const onOuterAbort = () => local.abort(outer.reason);
  outer.addEventListener("abort", onOuterAbort, { once: true });
  const signal = local.signal;
  // Pieces ahead of the one being written are held in memory: at most this many.
  const window = settings.connections + 2;
  let next = 0;
  const worker = async () => {
    while (next < pieces.length && !signal.aborted) {
      const i = next++;
      const piece = pieces[i] as Piece;
      await writer.admit(i, window, signal);
      await withRetries(
        async () => {
          // got leaves its abort listener on the signal it is given: a signal per request
          // keeps thousands of pieces from piling listeners onto the file's signal.
          const request = new AbortController();
          const cancel = () => request.abort(signal.reason);
          signal.addEventListener("abort", cancel, { once: true });
          try {
            const from = piece.start + piece.received;
            const body = await location.open(from, piece.end, request.signal);
            for await (const chunk of body as AsyncIterable<Buffer>) {
              await writer.add(i, chunk);
              events.onBytes?.(chunk.length);
            }
          } finally {
            signal.removeEventListener("abort", cancel);
          }
          if (piece.start + piece.received !== piece.end) throw shortBody(piece);
        },
        client.options,
        signal,
        (err, waitMs, n) =>
          events.onRetry?.(
            retryNotice(err, n, waitMs, {
              label,
              endpoint: client.options.endpoint,
              retries: client.options.retries,
            }),
          ),
      );
      await writer.complete(i);
    }
  };
  const workers = Array.from({ length: Math.min(settings.connections, pieces.length) }, () =>
    worker().catch((err) => {
      local.abort(err);
      throw err;
    }),
  );
  const results = await Promise.allSettled(workers);
  outer.removeEventListener("abort", onOuterAbort);
  // Whatever is contiguous reaches the disk, so an interrupted run resumes from it.
  await writer.flush();
  if (outer.aborted) throw outer.reason;
  const failure = results.find((r) => r.status === "rejected");
  if (failure) throw local.signal.reason ?? (failure as PromiseRejectedResult).reason;
}
