import { setMaxListeners } from "node:events";
import { rm, rmdir, stat } from "node:fs/promises";
import path from "node:path";
import type { DownloadConfig } from "../config/schemas/download.js";
import { CliError } from "../runtime/errors.js";
import { formatBytes } from "../runtime/progress.js";
import { table } from "../runtime/table.js";
import {
  createTransferProgress,
  formatDuration,
  type TransferProgress,
} from "../runtime/transfer-progress.js";
import { type Artifact, parseSelections, selectFiles } from "./artifacts.js";
import { HubClient, type RemoteFile } from "./client.js";
import { contentHash, expectedDigest, hashPrefix } from "./digest.js";
import { ensureSpace, type SpaceNeed } from "./disk.js";
import { fetchFile, partialPath } from "./fetch-file.js";
import { explainHubError } from "./http-errors.js";
import { Manifest } from "./manifest.js";
import { archiveStem, extractTar, gunzipFile, joinFiles } from "./post-steps.js";
import type { RepoRef } from "./repo.js";

/** A file of an artifact and what is on disk for it already. */
interface PlannedFile {
  repo: RepoRef;
  remote: RemoteFile;
  /** Path under --save-path, with forward slashes. */
  rel: string;
  dest: string;
  /** "sha256:<hex>" or "git-sha1:<hex>". */
  digest: string;
  /** verified: recorded by an earlier run; found: on disk, not yet checked; else bytes of a partial. */
  state: "verified" | "found" | "partial" | "missing";
  have: number;
}

interface PlannedArtifact {
  artifact: Artifact;
  files: PlannedFile[];
  /** Its joined, expanded or extracted outputs exist from an earlier run. */
  made: boolean;
}

export interface DownloadRow {
  item: string;
  size: number | undefined;
  status: string;
}

export interface DownloadReport {
  rows: DownloadRow[];
  /** Bytes fetched over the network in this run. */
  fetched: number;
  seconds: number;
}

function digestId(file: RemoteFile): string {
  const d = expectedDigest(file);
  return `${d.algorithm}:${d.hex}`;
}

/** The `.gz` files an artifact expands: plain gzip, not gzipped tar archives. */
function gzipped(pa: PlannedArtifact): PlannedFile[] {
  return pa.artifact.gunzip
    ? pa.files.filter((f) => f.rel.endsWith(".gz") && archiveStem(f.rel) === undefined)
    : [];
}

/** `wiki-18.jsonl.gz` → `wiki-18.jsonl`. */
function expandedName(rel: string): string {
  return rel.slice(0, -".gz".length);
}

function archives(pa: PlannedArtifact): PlannedFile[] {
  return pa.artifact.untar ? pa.files.filter((f) => archiveStem(f.rel) !== undefined) : [];
}

/** What an artifact makes from its downloads, as the report names it. */
function outputsOf(pa: PlannedArtifact): string[] {
  return [
    ...(pa.artifact.join ? [pa.artifact.join] : []),
    ...gzipped(pa).map((f) => expandedName(f.rel)),
    ...archives(pa).map((f) => `${f.rel} (extracted)`),
  ];
}

/** Whether an artifact with post-download steps has all their outputs from an earlier run. */
async function alreadyMade(pa: PlannedArtifact, manifest: Manifest): Promise<boolean> {
  const checks: Promise<boolean>[] = [];
  if (pa.artifact.join) {
    checks.push(
      manifest.isProduced(
        pa.artifact.join,
        pa.files.map((f) => f.digest),
      ),
    );
  }
  for (const f of gzipped(pa)) checks.push(manifest.isProduced(expandedName(f.rel), [f.digest]));
  for (const f of archives(pa)) checks.push(manifest.isProduced(f.rel, [f.digest]));
  if (checks.length === 0) return false;
  return (await Promise.all(checks)).every(Boolean);
}

async function planFile(
  saveDir: string,
  artifact: Artifact,
  repo: RepoRef,
  remote: RemoteFile,
  manifest: Manifest,
): Promise<PlannedFile> {
  const rel = path.posix.join(artifact.dir, remote.path);
  const dest = path.join(saveDir, ...rel.split("/"));
  const digest = digestId(remote);
  const base = { repo, remote, rel, dest, digest };
  if (await manifest.isVerified(rel, digest, remote.size))
    return { ...base, state: "verified", have: remote.size };
  const final = await stat(dest).catch(() => undefined);
  if (final?.isFile() && final.size === remote.size) return { ...base, state: "found", have: 0 };
  const partial = (await stat(partialPath(dest)).catch(() => undefined))?.size ?? 0;
  if (partial > 0 && partial <= remote.size) return { ...base, state: "partial", have: partial };
  return { ...base, state: "missing", have: 0 };
}

async function plan(
  config: DownloadConfig,
  saveDir: string,
  client: HubClient,
  manifest: Manifest,
  signal: AbortSignal,
): Promise<PlannedArtifact[]> {
  const artifacts = parseSelections({
    what: config.what,
    repo: config.repo,
    repoType: config.repo_type,
    include: config.include,
  });
  const listings = new Map<string, Promise<RemoteFile[]>>();
  const planned: PlannedArtifact[] = [];
  for (const artifact of artifacts) {
    const repo: RepoRef = {
      id: artifact.repoId,
      type: artifact.repoType,
      revision: config.revision,
    };
    const key = `${repo.type}:${repo.id}`;
    if (!listings.has(key)) listings.set(key, client.listFiles(repo, signal));
    let listing: RemoteFile[];
    try {
      listing = await (listings.get(key) as Promise<RemoteFile[]>);
    } catch (err) {
      throw explainHubError(err, {
        repo,
        hasToken: client.hasToken,
        endpoint: client.options.endpoint,
      });
    }
    const files = await Promise.all(
      selectFiles(artifact, listing).map((f) => planFile(saveDir, artifact, repo, f, manifest)),
    );
    const pa = { artifact, files, made: false };
    pa.made = await alreadyMade(pa, manifest);
    planned.push(pa);
  }
  return planned;
}

/** Each file once, even when two selections name it. */
function filesToFetch(planned: PlannedArtifact[]): PlannedFile[] {
  const byRel = new Map<string, PlannedFile>();
  for (const pa of planned) {
    if (pa.made) continue;
    for (const f of pa.files) byRel.set(f.rel, f);
  }
  return [...byRel.values()];
}

function describeState(f: PlannedFile): string {
  switch (f.state) {
    case "verified":
      return "present";
    case "found":
      return "present, to verify";
    case "partial":
      return `resume from ${formatBytes(f.have)}`;
    default:
      return "to download";
  }
}

/** The `--dry-run` answer: every file, its size and what a real run would do with it. */
function dryRunRows(planned: PlannedArtifact[]): DownloadRow[] {
  const rows: DownloadRow[] = [];
  const seen = new Set<string>();
  for (const pa of planned) {
    for (const f of pa.files) {
      if (seen.has(f.rel)) continue;
      seen.add(f.rel);
      const status = pa.made ? "not needed (outputs present)" : describeState(f);
      rows.push({
        item: `${pa.artifact.repoId}: ${f.remote.path} -> ${f.rel}`,
        size: f.remote.size,
        status,
      });
    }
    for (const item of outputsOf(pa)) {
      rows.push({ item, size: undefined, status: pa.made ? "present" : "made after download" });
    }
  }
  return rows;
}

function spaceNeeds(planned: PlannedArtifact[], files: PlannedFile[]): SpaceNeed[] {
  const downloads = files
    .filter((f) => f.state !== "verified")
    .reduce((s, f) => s + f.remote.size - f.have, 0);
  const joins = planned
    .filter((pa) => pa.artifact.join && !pa.made)
    .reduce((s, pa) => s + pa.files.reduce((t, f) => t + f.remote.size, 0), 0);
  return [
    { label: "downloads", bytes: downloads },
    { label: "joining parts", bytes: joins },
  ];
}

/** Files already on disk that no run has verified are hashed once; a mismatch is fetched again. */
async function verifyFound(
  f: PlannedFile,
  manifest: Manifest,
  progress: TransferProgress,
  signal: AbortSignal,
): Promise<boolean> {
  progress.log(`${f.rel}: found on disk, verifying it`);
  const d = expectedDigest(f.remote);
  const hash = contentHash(d, f.remote.size);
  await hashPrefix(f.dest, hash, f.remote.size, signal);
  if (hash.digest("hex") === d.hex) {
    await manifest.recordFile(f.rel, f.digest);
    progress.log(`${f.rel}: already present, verified`);
    return true;
  }
  progress.log(
    `${f.rel}: present but its ${d.algorithm} differs from the hub's; downloading it again`,
  );
  return false;
}

async function runPool<T>(
  items: T[],
  width: number,
  work: (item: T) => Promise<void>,
): Promise<void> {
  let next = 0;
  const lane = async () => {
    for (let item = items[next++]; item !== undefined; item = items[next++]) await work(item);
  };
  await Promise.all(Array.from({ length: Math.min(width, items.length) }, lane));
}

/** Joins, expands and extracts what the artifacts need, dropping the inputs unless kept. */
async function finishArtifacts(
  planned: PlannedArtifact[],
  saveDir: string,
  config: DownloadConfig,
  manifest: Manifest,
  progress: TransferProgress,
  signal: AbortSignal,
  rows: DownloadRow[],
): Promise<void> {
  const drop = async (f: PlannedFile) => {
    await rm(f.dest, { force: true });
    await manifest.forgetFile(f.rel);
  };
  for (const pa of planned) {
    const { join } = pa.artifact;
    if (pa.made) {
      for (const item of outputsOf(pa)) rows.push({ item, size: undefined, status: "present" });
      continue;
    }
    if (join) {
      progress.log(`joining ${pa.files.length} parts into ${join}`);
      const output = path.join(saveDir, join);
      await joinFiles(
        pa.files.map((f) => f.dest),
        output,
        signal,
      );
      await manifest.recordOutput(
        join,
        pa.files.map((f) => f.digest),
      );
      if (!config.keep_parts) {
        for (const f of pa.files) await drop(f);
        if (pa.artifact.dir) await rmdir(path.join(saveDir, pa.artifact.dir)).catch(() => {});
      }
      rows.push({
        item: join,
        size: (await stat(output)).size,
        status: `joined ${pa.files.length} parts`,
      });
    }
    for (const f of gzipped(pa)) {
      const outRel = expandedName(f.rel);
      progress.log(`expanding ${f.rel}`);
      await gunzipFile(f.dest, path.join(saveDir, outRel), signal);
      await manifest.recordOutput(outRel, [f.digest]);
      if (!config.keep_gz) await drop(f);
      rows.push({
        item: outRel,
        size: (await stat(path.join(saveDir, outRel))).size,
        status: "expanded",
      });
    }
    for (const f of archives(pa)) {
      progress.log(`extracting ${f.rel}`);
      const entries = await extractTar(f.dest, path.dirname(f.dest));
      await manifest.recordExtraction(f.rel, [f.digest], entries);
      if (!config.keep_parts) await drop(f);
      rows.push({
        item: `${f.rel} -> ${entries.join(", ")}`,
        size: undefined,
        status: "extracted",
      });
    }
  }
}

/** What the files of one run share. */
interface Run {
  client: HubClient;
  config: DownloadConfig;
  manifest: Manifest;
  progress: TransferProgress;
  signal: AbortSignal;
  rows: DownloadRow[];
  /** Bytes fetched over the network so far. */
  fetched: number;
}

/** Fetches one file (or verifies the copy found on disk) and adds its report row. */
async function downloadOne(f: PlannedFile, run: Run): Promise<void> {
  const { client, config, manifest, progress, signal } = run;
  if (f.state === "found" && (await verifyFound(f, manifest, progress, signal))) {
    run.rows.push({ item: f.rel, size: f.remote.size, status: "present (verified)" });
    return;
  }
  const t0 = Date.now();
  const bar = progress.file(f.rel, f.remote.size, f.have);
  let moved = 0;
  try {
    const { resumedFrom } = await fetchFile(
      client,
      { repo: f.repo, remote: f.remote, dest: f.dest },
      {
        connections: config.connections,
        pieceBytes: Math.max(1, Math.round(config.piece_mb * 2 ** 20)),
      },
      signal,
      {
        onBytes: (n) => {
          moved += n;
          run.fetched += n;
          bar.add(n);
        },
        onRetry: (message) => progress.log(message),
      },
    );
    const secs = (Date.now() - t0) / 1000;
    const rate = `${formatBytes(moved / Math.max(secs, 1e-3))}/s`;
    const how = resumedFrom > 0 ? `resumed from ${formatBytes(resumedFrom)}` : "downloaded";
    bar.done(
      `${how}, ${formatBytes(f.remote.size)} in ${formatDuration(secs)} (${rate}), verified`,
    );
    await manifest.recordFile(f.rel, f.digest);
    run.rows.push({ item: f.rel, size: f.remote.size, status: `${how}, verified` });
  } catch (err) {
    bar.done(signal.aborted ? "interrupted" : "failed");
    throw err;
  }
}

/** `searchr1 download`: plans, checks space, fetches files in parallel, then finishes artifacts. */
export async function runDownload(
  config: DownloadConfig,
  signal: AbortSignal,
  stream?: NodeJS.WriteStream,
): Promise<DownloadReport> {
  const started = Date.now();
  // Each file in flight listens for Ctrl-C.
  setMaxListeners(4 * config.parallel_files + 16, signal);
  const saveDir = path.resolve(config.save_path);
  // Retries are announced as they happen: on stderr while planning, then above the bars.
  const out = stream ?? process.stderr;
  let notice = (message: string) => {
    if (!config.quiet) out.write(`${message}\n`);
  };
  const client = new HubClient({
    endpoint: config.endpoint,
    token: config.token,
    timeoutS: config.timeout_s,
    retries: config.retries,
    backoffS: config.backoff_s,
    onRetry: (message) => notice(message),
  });
  const manifest = await Manifest.load(saveDir);
  const planned = await plan(config, saveDir, client, manifest, signal);
  const files = filesToFetch(planned);
  if (config.dry_run) return { rows: dryRunRows(planned), fetched: 0, seconds: 0 };

  await ensureSpace(saveDir, spaceNeeds(planned, files));
  const pending = files.filter((f) => f.state !== "verified");
  const progress = createTransferProgress({
    total: pending.reduce((s, f) => s + f.remote.size - f.have, 0),
    quiet: config.quiet,
    stream,
    intervalS: config.progress_s,
  });
  notice = (message) => progress.log(message);
  const rows: DownloadRow[] = files
    .filter((f) => f.state === "verified")
    .map((f) => ({ item: f.rel, size: f.remote.size, status: "present" }));
  const failures: string[] = [];
  const run: Run = { client, config, manifest, progress, signal, rows, fetched: 0 };
  try {
    await runPool(pending, config.parallel_files, async (f) => {
      if (signal.aborted) return;
      await downloadOne(f, run).catch((err) => {
        if (signal.aborted) return;
        const e = explainHubError(err, {
          repo: f.repo,
          path: f.remote.path,
          hasToken: client.hasToken,
          endpoint: client.options.endpoint,
        });
        failures.push(e.message);
        progress.log(`error: ${e.message}`);
      });
    });
  } finally {
    progress.stop();
  }
  signal.throwIfAborted();
  if (failures.length > 0) {
    const kept = pending.some((f) => f.state !== "found")
      ? "; partial downloads are kept, run the same command to resume"
      : "";
    // An unreachable host fails every file the same way: say it once.
    const distinct = [...new Set(failures)];
    throw new CliError(
      failures.length === 1
        ? `${failures[0]}${kept}`
        : distinct.length === 1
          ? `${failures.length} files failed: ${distinct[0]}${kept}`
          : `${failures.length} files failed:\n  ${failures.join("\n  ")}${kept}`,
      1,
    );
  }
  await finishArtifacts(planned, saveDir, config, manifest, progress, signal, rows);
  return { rows, fetched: run.fetched, seconds: (Date.now() - started) / 1000 };
}

/** The end-of-run table (and the `--dry-run` listing) on stdout. */
export function formatReport(report: DownloadReport, dryRun: boolean): string {
  const lines = table(
    [
      [dryRun ? "file" : "item", "size", "status"],
      ...report.rows.map((r) => [
        r.item,
        r.size === undefined ? "" : formatBytes(r.size),
        r.status,
      ]),
    ],
    new Set([1]),
  );
  if (dryRun) {
    const total = report.rows
      .filter((r) => r.status === "to download" || r.status.startsWith("resume"))
      .reduce((s, r) => s + (r.size ?? 0), 0);
    lines.push("", `to download: ${formatBytes(total)} (dry run: nothing was written)`);
  } else {
    const rate = report.fetched / Math.max(report.seconds, 1e-3);
    lines.push(
      "",
      `fetched ${formatBytes(report.fetched)} in ${formatDuration(report.seconds)} (${formatBytes(rate)}/s)`,
    );
  }
  return lines.join("\n");
}
