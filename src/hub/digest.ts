import { createHash, type Hash } from "node:crypto";
import { createReadStream } from "node:fs";
import type { RemoteFile } from "./client.js";

/** The hash the hub publishes for a file: sha256 for LFS files, the git blob sha1 otherwise. */
export interface ExpectedDigest {
  algorithm: "sha256" | "git-sha1";
  hex: string;
}

export function expectedDigest(file: RemoteFile): ExpectedDigest {
  return file.sha256
    ? { algorithm: "sha256", hex: file.sha256.toLowerCase() }
    : { algorithm: "git-sha1", hex: file.gitOid.toLowerCase() };
}

/** A running hash of a file's content; the git form hashes the "blob <size>\0" header first. */
export function contentHash(digest: ExpectedDigest, size: number): Hash {
  if (digest.algorithm === "sha256") return createHash("sha256");
  return createHash("sha1").update(`blob ${size}\0`);
}

/** Feeds the first `length` bytes of a local file to a hash (resuming, or checking a file found on disk). */
export async function hashPrefix(
  file: string,
  hash: Hash,
  length: number,
  signal?: AbortSignal,
): Promise<void> {
  if (length === 0) return;
  const stream = createReadStream(file, {
    start: 0,
    end: length - 1,
    highWaterMark: 1 << 20,
    signal,
  });
  for await (const chunk of stream as AsyncIterable<Buffer>) {
    hash.update(chunk);
  }
}
