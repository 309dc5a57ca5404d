/**
 * Benchmark: `searchr1 download` against curl fetching the same file from the same local
 * hub-like server in the same run; then, with the server throttled per connection, searchr1
 * with 1 and with 8 connections (and curl, one connection, for reference).
 * Usage: npm run bench:download [-- MiB [throttled-MiB [MiB/s-per-connection]]]
 *        (defaults: 1024 MiB, 256 MiB at 16 MiB/s per connection)
 */
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { packageRoot } from "../src/runtime/package-root.js";
import { createHubServer } from "../test/helpers/hub-server.js";

const MiB = 2 ** 20;
const size = Number(process.argv[2] ?? 1024) * MiB;
const throttledSize = Number(process.argv[3] ?? 256) * MiB;
const perConnection = Number(process.argv[4] ?? 16) * MiB;
const work = mkdtempSync(join(tmpdir(), "searchr1-bench-dl-"));
const bin = join(packageRoot(), "bin", "searchr1");

/** Runs a command to completion without blocking the in-process server; returns seconds. */
function timed(cmd: string, args: string[]): Promise<number> {
  return new Promise((resolve, reject) => {
    const t = process.hrtime.bigint();
    const child = spawn(cmd, args, { stdio: ["ignore", "ignore", "inherit"] });
    child.on("error", reject);
    child.on("close", (code) => {
      if (code !== 0) reject(new Error(`${cmd} ${args.join(" ")} exited ${code}`));
      else resolve(Number(process.hrtime.bigint() - t) / 1e9);
    });
  });
}

function expectSize(file: string, bytes: number) {
  const got = statSync(file).size;
  if (got !== bytes) throw new Error(`${file}: ${got} bytes, expected ${bytes}`);
}

async function main() {
  const big = randomBytes(size);
  const small = big.subarray(0, throttledSize);
  const hub = await createHubServer({
    repos: [
      { id: "bench/big", type: "dataset", files: [{ path: "big.bin", content: big, lfs: true }] },
      {
        id: "bench/throttled",
        type: "dataset",
        files: [{ path: "t.bin", content: small, lfs: true }],
      },
    ],
  });
  const url = (repo: string, file: string) => `${hub.url}/datasets/${repo}/resolve/main/${file}`;
  const searchr1 = (repo: string, out: string, connections: number) =>
    timed(process.execPath, [
      bin,
      "download",
      "--save-path",
      join(work, out),
      "--repo",
      repo,
      "--connections",
      String(connections),
      "--quiet",
      `endpoint=${hub.url}`,
    ]);
  const curl = (repo: string, file: string, out: string) =>
    timed("curl", ["-sS", "-L", "--fail", "-o", join(work, out), url(repo, file)]);
  const rate = (bytes: number, s: number) => `${(bytes / MiB / s).toFixed(0)} MiB/s`;
  try {
    const tCurl = await curl("bench/big", "big.bin", "curl.bin");
    expectSize(join(work, "curl.bin"), size);
    rmSync(join(work, "curl.bin"));
    const tOurs = await searchr1("bench/big", "ours", 8);
    expectSize(join(work, "ours", "big.bin"), size);
    rmSync(join(work, "ours"), { recursive: true });

    hub.setFaults({ bytesPerSecond: perConnection });
    const tCurlSlow = await curl("bench/throttled", "t.bin", "curl-t.bin");
    const tOne = await searchr1("bench/throttled", "one", 1);
    const tEight = await searchr1("bench/throttled", "eight", 8);
    expectSize(join(work, "eight", "t.bin"), throttledSize);

    const rows = [
      ["case", "searchr1", "curl", "ratio (curl time / ours)"],
      [
        `${size / MiB} MiB, unthrottled, 8 connections, sha256 verified`,
        `${tOurs.toFixed(2)} s, ${rate(size, tOurs)}`,
        `${tCurl.toFixed(2)} s, ${rate(size, tCurl)}`,
        (tCurl / tOurs).toFixed(2),
      ],
      [
        `${throttledSize / MiB} MiB at ${perConnection / MiB} MiB/s per connection, 1 connection`,
        `${tOne.toFixed(2)} s, ${rate(throttledSize, tOne)}`,
        `${tCurlSlow.toFixed(2)} s, ${rate(throttledSize, tCurlSlow)}`,
        (tCurlSlow / tOne).toFixed(2),
      ],
      [
        `${throttledSize / MiB} MiB at ${perConnection / MiB} MiB/s per connection, 8 connections`,
        `${tEight.toFixed(2)} s, ${rate(throttledSize, tEight)}`,
        `${tCurlSlow.toFixed(2)} s, ${rate(throttledSize, tCurlSlow)}`,
        (tCurlSlow / tEight).toFixed(2),
      ],
    ];
    for (const r of rows) console.log(r.join(" | "));
    console.log(`8 vs 1 connections under throttling: ${(tOne / tEight).toFixed(2)}x faster`);
  } finally {
    await hub.close();
    rmSync(work, { recursive: true, force: true });
  }
}

await main();
