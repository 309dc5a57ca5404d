/**
 * Benchmark: `searchr1 convert megatron-to-hf` against the same conversion done the way the
 * reference converters (Megatron-LM's and verl's Megatron → HF mergers) do it in PyTorch
 * (Debian's python3-torch), on the very same checkpoint, in the same run, on this machine.
 *
 * Usage: npm run build && npm run bench:convert [-- OPTIONS]
 *   --keep          keep the temporary folder (input checkpoint and both outputs)
 *   --python PATH   the Python with torch (default /usr/bin/python3)
 *
 * Input: bench/convert/torch_convert.py `make` writes a seeded random bf16 model of
 * Qwen2.5-0.5B's shape (vocab 151,936, hidden 896, intermediate 4,864, 24 layers, 14 heads,
 * 2 kv heads, tied embeddings, qkv biases: 494M parameters, ~1 GB) into a temporary folder,
 * as an HF base folder (config.json, tokenizer_config.json) and a megatron-core checkpoint
 * at tensor-parallel 2, pipeline 1, with Transformer-Engine names (the layout of the
 * converter's test fixtures, test/ckpt/make_fixtures.py). Making it is timed on its own and
 * not compared.
 *
 * The two sides, each a fresh process writing to a folder removed just before it starts:
 *   searchr1  node bin/searchr1 convert megatron-to-hf --input … --hf-base … --out … --quiet
 *   torch     torch_convert.py convert: torch.load both rank files whole, merge with
 *             torch.cat / per-query-group QKV split / per-TP-slice gate-up split, write one
 *             safetensors file in HF order (see that file).
 * Each runs under /usr/bin/time -f %M (peak resident set size); the wall time is taken here
 * around the child, so both include process start-up and imports. The sides run twice,
 * alternately (searchr1, torch, searchr1, torch), and each side's faster run is reported;
 * both read the input from the page cache (it was just written); `sync` runs (untimed) before
 * each run, and neither side syncs its own output to disk. GB/s = bytes of safetensors written (10⁹ bytes per GB) / wall seconds.
 *
 * Afterwards every tensor searchr1 wrote must be in torch's file with the same dtype, shape
 * and bytes (compared piecewise at their file offsets), and the two must hold the same
 * tensors; otherwise the benchmark fails (exit 1), as it would not compare the same work.
 */
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { type FileHandle, open } from "node:fs/promises";
import { availableParallelism, cpus, loadavg, tmpdir, totalmem } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { packageRoot } from "../../src/runtime/package-root.js";
import { table } from "../../src/runtime/table.js";
import { readSafetensorsHeader, shapeStr, type TensorInfo } from "../../src/tensors/safetensors.js";
import { fmt, log } from "../common.js";

const TP = 2;
const RUNS = 2;
const TIME = "/usr/bin/time";
/** Bytes compared per read when checking the outputs. */
const CHUNK = 16 << 20;

const { values: opts } = parseArgs({
  options: {
    keep: { type: "boolean", default: false },
    python: { type: "string" },
  },
});

const python = opts.python ?? "/usr/bin/python3";
const root = packageRoot();
const script = join(root, "bench", "convert", "torch_convert.py");
const cli = join(root, "bin", "searchr1");

/** One timed child process. */
interface Run {
  wall: number;
  /** Peak resident set size in bytes, from /usr/bin/time. */
  rss: number;
  stdout: string;
}

/**
 * Runs `cmd args` under /usr/bin/time -f %M; exits with a message when it fails. Dirty pages
 * (the input just written, the previous run's output) are flushed first, untimed, so that
 * neither side pays for the other's write-back.
 */
function timed(who: string, cmd: string, args: string[]): Run {
  spawnSync("sync", { stdio: "ignore" });
  const start = performance.now();
  const r = spawnSync(TIME, ["-f", "%M", cmd, ...args], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "pipe"],
    maxBuffer: 64 << 20,
  });
  const wall = (performance.now() - start) / 1000;
  if (r.error) throw new Error(`${who}: cannot run ${TIME}: ${r.error.message}`);
  const errLines = r.stderr.trimEnd().split("\n");
  const last = errLines.at(-1) ?? "";
  if (r.status === 3 && cmd === python) {
    console.error(
      `bench:convert needs PyTorch, the competitor it measures against, in ${python}.\n` +
        "  Debian/Ubuntu: apt-get update && apt-get install -y python3-torch libopenblas0\n" +
        "  (another Python with torch: pass --python PATH)",
    );
    process.exit(1);
  }
  if (r.status !== 0) {
    // An out-of-memory kill shows as "Command terminated by signal 9".
    console.error(`bench:convert: ${who} failed (exit ${r.status}):\n${r.stderr}`);
    process.exit(1);
  }
  const kib = Number(last.trim());
  if (!Number.isInteger(kib)) throw new Error(`${who}: no peak RSS from ${TIME}: ${last}`);
  return { wall, rss: kib * 1024, stdout: r.stdout };
}

/** The safetensors files of an HF folder written by `convert` (one file or an index's shards). */
function hfShards(dir: string): string[] {
  const index = join(dir, "model.safetensors.index.json");
  if (!existsSync(index)) return [join(dir, "model.safetensors")];
  const map = (JSON.parse(readFileSync(index, "utf8")) as { weight_map: Record<string, string> })
    .weight_map;
  return [...new Set(Object.values(map))].sort().map((f) => join(dir, f));
}

interface Located {
  file: string;
  dataStart: number;
  info: TensorInfo;
}

async function tensorsOf(files: string[]): Promise<Map<string, Located>> {
  const out = new Map<string, Located>();
  for (const file of files) {
    const header = await readSafetensorsHeader(file);
    for (const info of header.tensors)
      out.set(info.name, { file, dataStart: header.dataStart, info });
  }
  return out;
}

async function readExactly(h: FileHandle, buf: Buffer, length: number, position: number) {
  let done = 0;
  while (done < length) {
    const { bytesRead } = await h.read(buf, done, length - done, position + done);
    if (bytesRead === 0) throw new Error("unexpected end of file");
    done += bytesRead;
  }
}

/** Problems found comparing searchr1's output (every tensor) with torch's file; [] = agree. */
async function compareOutputs(oursDir: string, theirsFile: string): Promise<string[]> {
  const ours = await tensorsOf(hfShards(oursDir));
  const theirs = await tensorsOf([theirsFile]);
  const problems: string[] = [];
  for (const name of theirs.keys()) {
    if (!ours.has(name)) problems.push(`${name}: in torch's output only`);
  }
  const handles = new Map<string, FileHandle>();
  const handle = async (file: string) => {
    let h = handles.get(file);
    if (!h) {
      h = await open(file, "r");
      handles.set(file, h);
    }
    return h;
  };
  const a = Buffer.allocUnsafe(CHUNK);
  const b = Buffer.allocUnsafe(CHUNK);
  try {
    for (const [name, o] of ours) {
      const t = theirs.get(name);
      if (!t) {
        problems.push(`${name}: in searchr1's output only`);
        continue;
      }
      if (o.info.dtype !== t.info.dtype || shapeStr(o.info.shape) !== shapeStr(t.info.shape)) {
        problems.push(
          `${name}: searchr1 ${o.info.dtype} ${shapeStr(o.info.shape)}, ` +
            `torch ${t.info.dtype} ${shapeStr(t.info.shape)}`,
        );
        continue;
      }
      const size = o.info.end - o.info.begin;
      if (size !== t.info.end - t.info.begin) {
        problems.push(`${name}: ${size} bytes vs ${t.info.end - t.info.begin}`);
        continue;
      }
      const ho = await handle(o.file);
      const ht = await handle(t.file);
      for (let off = 0; off < size; off += CHUNK) {
        const n = Math.min(CHUNK, size - off);
        await readExactly(ho, a, n, o.dataStart + o.info.begin + off);
        await readExactly(ht, b, n, t.dataStart + t.info.begin + off);
        if (a.compare(b, 0, n, 0, n) !== 0) {
          problems.push(`${name}: bytes differ in [${off}, ${off + n})`);
          break;
        }
      }
    }
  } finally {
    for (const h of handles.values()) await h.close();
  }
  if (ours.size === 0) problems.push("searchr1 wrote no tensors");
  return problems;
}

const fileBytes = (files: string[]) => files.reduce((sum, f) => sum + statSync(f).size, 0);

async function main() {
  if (!existsSync(TIME)) {
    console.error(
      `bench:convert: ${TIME} (GNU time, for the peak RSS) is missing: apt-get install -y time`,
    );
    process.exit(1);
  }
  const work = mkdtempSync(join(tmpdir(), "searchr1-bench-convert-"));
  try {
    const input = join(work, "input");
    log(`writing a random Qwen2.5-0.5B-shaped Megatron checkpoint (TP ${TP}) to ${input} ...`);
    const make = timed("torch_convert.py make", python, [
      script,
      "make",
      input,
      "--tp",
      String(TP),
    ]);
    const made = JSON.parse(make.stdout) as { params: number; torch: string; python: string };
    const megatron = join(input, "megatron");
    const hfBase = join(input, "hf");
    const oursDir = join(work, "ours");
    const theirsFile = join(work, "torch.safetensors");
    const inputBytes = fileBytes(
      Array.from({ length: TP }, (_, t) =>
        join(
          megatron,
          "iter_0000001",
          `mp_rank_${String(t).padStart(2, "0")}`,
          "model_optim_rng.pt",
        ),
      ),
    );

    const runOurs = () => {
      rmSync(oursDir, { recursive: true, force: true });
      return timed("searchr1 convert", process.execPath, [
        cli,
        "convert",
        "megatron-to-hf",
        "--input",
        megatron,
        "--hf-base",
        hfBase,
        "--out",
        oursDir,
        "--quiet",
      ]);
    };
    const runTorch = () => {
      rmSync(theirsFile, { force: true });
      return timed("torch_convert.py convert", python, [
        script,
        "convert",
        megatron,
        join(hfBase, "config.json"),
        theirsFile,
      ]);
    };
    const oursRuns: Run[] = [];
    const torchRuns: Run[] = [];
    for (let i = 1; i <= RUNS; i++) {
      log(`run ${i}/${RUNS}: searchr1 convert megatron-to-hf ...`);
      oursRuns.push(runOurs());
      log(`  ${oursRuns.at(-1)?.wall.toFixed(2)} s`);
      log(`run ${i}/${RUNS}: torch_convert.py convert ...`);
      torchRuns.push(runTorch());
      log(`  ${torchRuns.at(-1)?.wall.toFixed(2)} s`);
    }
    const best = (runs: Run[]) => runs.reduce((x, y) => (y.wall < x.wall ? y : x));
    const ours = best(oursRuns);
    const torch = best(torchRuns);
    const torchSelf = JSON.parse(torch.stdout) as {
      seconds: number;
      load_s: number;
      merge_s: number;
      write_s: number;
    };

    log("checking that both outputs hold the same tensors, byte for byte ...");
    const oursFiles = hfShards(oursDir);
    const problems = await compareOutputs(oursDir, theirsFile);
    if (problems.length > 0) {
      console.error(
        `bench:convert: FAILED: the outputs differ (${problems.length} problem(s)):\n  ` +
          problems.slice(0, 20).join("\n  "),
      );
      process.exitCode = 1;
      return;
    }
    const tensorCount = (await tensorsOf(oursFiles)).size;
    const oursBytes = fileBytes(oursFiles);
    const torchBytes = fileBytes([theirsFile]);

    const cpu = cpus()[0]?.model.trim() ?? "unknown CPU";
    const gib = (n: number) => `${fmt(n / 2 ** 30, 2)} GiB`;
    const lines = [
      "",
      "## Megatron → Hugging Face conversion vs PyTorch (CPU)",
      "",
      `Machine: ${cpu}, ${availableParallelism()} cores, ${fmt(totalmem() / 2 ** 30, 1)} GiB RAM; ` +
        `Node ${process.version}; PyTorch ${made.torch} (Python ${made.python}). 1-minute load ` +
        `average ${(loadavg()[0] as number).toFixed(2)} at the end.`,
      `Input: Qwen2.5-0.5B shape, ${fmt(made.params)} parameters, bf16, tied embeddings, ` +
        `Megatron-core TP ${TP} / PP 1 (${fmt(inputBytes / 1e9, 2)} GB in ${TP} rank files; made ` +
        `in ${make.wall.toFixed(1)} s, not compared). Output: ${tensorCount} tensors, identical ` +
        "on both sides (dtype, shape, bytes).",
      `Best of ${RUNS} alternating runs per side; wall time includes process start-up and imports.`,
      "",
      ...table(
        [
          ["side", "wall s", "peak RSS", "output GB/s"],
          [
            "searchr1 convert",
            ours.wall.toFixed(2),
            gib(ours.rss),
            fmt(oursBytes / 1e9 / ours.wall, 2),
          ],
          [
            "torch (torch.load + cat)",
            torch.wall.toFixed(2),
            gib(torch.rss),
            fmt(torchBytes / 1e9 / torch.wall, 2),
          ],
        ],
        new Set([1, 2, 3]),
      ),
      "",
      `torch / searchr1: ${(torch.wall / ours.wall).toFixed(2)}× the wall time, ` +
        `${(torch.rss / ours.rss).toFixed(2)}× the peak RSS.`,
      `All runs, wall s: searchr1 ${oursRuns.map((r) => r.wall.toFixed(2)).join(", ")}; ` +
        `torch ${torchRuns.map((r) => r.wall.toFixed(2)).join(", ")}. torch's own timer in its ` +
        `best run (after imports): load ${torchSelf.load_s.toFixed(2)} s, merge ` +
        `${torchSelf.merge_s.toFixed(2)} s, write ${torchSelf.write_s.toFixed(2)} s.`,
    ];
    console.log(lines.join("\n"));
  } finally {
    if (opts.keep) log(`kept ${work}`);
    else rmSync(work, { recursive: true, force: true });
  }
}

await main();
