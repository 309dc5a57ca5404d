/**
 * RL mode of `npm run bench:native -- --rl` (bench/native/run.ts parses the options): CPU
 * throughput of one actor update of GRPO (PPO policy loss + KL loss, forward and backward,
 * AdamW) in searchr1's `searchr1-trainer serve` against the same update in PyTorch eager,
 * in the same run, with the same thread count, on the very same random model and batch.
 *
 * bench/native/torch_rl.py `make` writes a seeded random fp32 Qwen2 of the ~50M shape and a
 * GRPO-shaped rollout batch: 16 sequences (4 prompts × 4 samples) in a [16, T] layout as
 * verl's (prompt left-padded in the first T/2 columns, response right-padded in the last
 * T/2), lengths spread between about T/5 and T (the longest is T; half the responses are
 * short), old and reference log-probs near the model's own, GRPO advantages of both signs
 * (torch_rl.py's docstring has the details). Four runs start, each loading the model:
 *   native padded   `searchr1-trainer serve`, update_actor with remove_padding false
 *   torch padded    torch_rl.py update: the same update on the same [rows, T] micro-batches
 *   native removed  `searchr1-trainer serve`, update_actor with remove_padding true
 *   torch removed   torch_rl.py update --remove-padding: rows sorted and compacted
 * then they take turns, one update each per round, for 1 + K rounds, so that the load other
 * work puts on a shared machine falls on all four alike.
 * Every update is the whole batch as one mini-batch (one optimizer step), micro-batches cut
 * by a budget of real tokens (ppo_max_token_len_per_gpu, --budget, default 4T), no
 * shuffling: clip 0.2, dual clip 3, low_var_kl at coefficient 0.001, token-mean over the
 * loss tokens, entropy coefficient 0, gradients clipped at 1.0, AdamW lr 1e-6, weight decay
 * 0.01. With padding removal the trainer packs each micro-batch's sequences end to end into one
 * row (attention within each sequence), so it computes the real tokens only. PyTorch has
 * no variable-length (packed) attention on CPU, so the least padding it can compute is what
 * torch_rl.py does: rows sorted longest first, cut by the budget, each micro-batch cut to
 * its longest row. The native side's time is the round trip of
 * each update_actor command (reading the small batch file included); torch_rl.py times its
 * own updates (time.perf_counter). Both sides' CPU time per update is reported too (the
 * trainer's from /proc/PID/stat, torch's time.process_time): on a shared machine it moves
 * less than wall time. The first update is a warm-up and is dropped; tokens/s = the
 * batch's real tokens / the median of the other K. All four start from the
 * same weights and batch, so their first update's pg_loss, kl_loss and gradient norm must
 * agree (fp32 rounding aside); the report shows them and warns when they do not.
 */
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { availableParallelism, cpus, loadavg, tmpdir, totalmem } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { createInterface, type Interface } from "node:readline";
import { CliError } from "../../src/runtime/errors.js";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { packageRoot } from "../../src/runtime/package-root.js";
import { table } from "../../src/runtime/table.js";
import { fmt, log } from "../common.js";
import { CPU_SHAPES, shapeArgs } from "./step.js";

export interface RlOptions {
  /** timed updates per run, after one warm-up */
  steps: number;
  threads: number;
  python: string;
  /** T, the padded length of the batch */
  seq: number;
  /** real tokens per micro-batch (ppo_max_token_len_per_gpu); default 4 × seq */
  budget?: number;
  /** torch's attention: SDPA (transformers' default) or Hugging Face's eager code */
  attention: "sdpa" | "eager";
}

const BATCH = 16;
const GROUP = 4;
const LR = 1e-6;
const WEIGHT_DECAY = 0.01;
const GRAD_CLIP = 1.0;
/** Largest step-1 gradient-norm difference (relative) and pg_loss / kl_loss difference
 * (absolute: both are token means of O(1) and O(1e-2) terms) still taken as the same
 * computation. */
const AGREEMENT = 1e-3;

/** One update's figures, as torch_rl.py prints them (and the trainer's reply, timed here). */
interface Update {
  pg_loss: number;
  kl_loss: number;
  pg_clipfrac: number;
  grad_norm: number;
  micro_batches: number;
  seconds: number;
  /** CPU time of the process, all threads */
  cpu_seconds: number;
}

interface Run {
  updates: Update[];
  median: number;
  /** median CPU seconds of the timed updates */
  cpuMedian: number;
}

function median(xs: number[]): number {
  const sorted = [...xs].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1
    ? (sorted[mid] as number)
    : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2;
}

function summarize(updates: Update[], steps: number, who: string): Run {
  if (updates.length !== 1 + steps) {
    throw new Error(`${who}: ${updates.length} updates reported, expected ${1 + steps}`);
  }
  const timed = updates.slice(1);
  return {
    updates,
    median: median(timed.map((u) => u.seconds)),
    cpuMedian: median(timed.map((u) => u.cpu_seconds)),
  };
}

/** User + system CPU seconds of a process (all its threads), from /proc. */
function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.split(" ") ?? [];
  // utime and stime are fields 14 and 15 of stat(5), in clock ticks (100 per second on
  // Linux: USER_HZ).
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/** A child process answering each line written to its stdin with one line on stdout. */
class LineChild {
  private readonly proc: ChildProcess;
  private readonly lines: Interface;
  private readonly waiting: ((line: string | undefined) => void)[] = [];
  private readonly queued: string[] = [];
  private exited = false;

  constructor(
    readonly name: string,
    command: string,
    args: string[],
    env: NodeJS.ProcessEnv,
  ) {
    this.proc = spawn(command, args, { env, stdio: ["pipe", "pipe", "inherit"] });
    this.lines = createInterface({ input: this.proc.stdout as NodeJS.ReadableStream });
    this.lines.on("line", (line) => {
      const w = this.waiting.shift();
      if (w) w(line);
      else this.queued.push(line);
    });
    this.proc.on("exit", () => {
      this.exited = true;
      for (const w of this.waiting.splice(0)) w(undefined);
    });
  }

  /** The next line of its stdout. */
  next(): Promise<string> {
    const line = this.queued.shift();
    if (line !== undefined) return Promise.resolve(line);
    if (this.exited) return Promise.reject(new Error(`${this.name} has exited`));
    return new Promise((resolve, reject) =>
      this.waiting.push((l) =>
        l === undefined ? reject(new Error(`${this.name} exited`)) : resolve(l),
      ),
    );
  }

  /** Writes a line; resolves with the reply, the wall seconds until it came and the CPU
   * seconds the process spent meanwhile. */
  async request(line: string): Promise<{ reply: string; seconds: number; cpuSeconds: number }> {
    const pid = this.proc.pid as number;
    const cpuStart = cpuSeconds(pid);
    const start = performance.now();
    this.proc.stdin?.write(`${line}\n`);
    const reply = await this.next();
    const seconds = (performance.now() - start) / 1000;
    return { reply, seconds, cpuSeconds: this.exited ? Number.NaN : cpuSeconds(pid) - cpuStart };
  }

  /** Ends its stdin (after `last`, when given) and waits for it to exit. */
  async close(last?: string): Promise<void> {
    if (!this.exited) {
      const done = new Promise((resolve) => this.proc.once("exit", resolve));
      this.proc.stdin?.end(last === undefined ? undefined : `${last}\n`);
      await done;
    }
    this.lines.close();
  }
}

/** `searchr1-trainer serve`: one JSON command per line, one JSON reply line each. */
class Serve {
  private readonly child: LineChild;
  private nextId = 1;

  constructor(trainer: string, threads: number, env: NodeJS.ProcessEnv) {
    const args = ["serve", "--device", "cpu", "--threads", String(threads)];
    this.child = new LineChild("searchr1-trainer serve", trainer, args, env);
  }

  /** Sends a command; the reply, its wall seconds and the trainer's CPU seconds. */
  async send(cmd: Record<string, unknown>) {
    const r = await this.child.request(JSON.stringify({ ...cmd, id: this.nextId++ }));
    return { ...r, reply: JSON.parse(r.reply) as Record<string, unknown> };
  }

  /** Sends a command; throws with the trainer's error when the reply is not ok. */
  async must(cmd: Record<string, unknown>) {
    const r = await this.send(cmd);
    if (r.reply.ok !== true) throw new Error(`serve ${cmd.op}: ${String(r.reply.error)}`);
    return r;
  }

  close(): Promise<void> {
    return this.child.close(JSON.stringify({ op: "shutdown", id: this.nextId++ }));
  }
}

/** One of the compared runs: started (model loaded), then one update per call. */
interface Contestant {
  name: string;
  update(): Promise<Update & { positions?: number }>;
  close(): Promise<void>;
}

export async function rlBench(opts: RlOptions): Promise<void> {
  const T = opts.seq;
  if (T % 16 !== 0) {
    console.error(`bench:native: --seq must be a multiple of 16, got ${T}`);
    process.exit(2);
  }
  const budget = opts.budget ?? 4 * T;
  const shape = CPU_SHAPES.find((s) => s.name === "~50M");
  if (!shape) throw new Error("bench/native/step.ts: no ~50M shape");
  const script = join(packageRoot(), "bench", "native", "torch_rl.py");
  const env = {
    ...process.env,
    OMP_NUM_THREADS: String(opts.threads),
    OPENBLAS_NUM_THREADS: String(opts.threads),
    MKL_NUM_THREADS: String(opts.threads),
  };
  const python = (args: string[]): string => {
    const r = spawnSync(opts.python, [script, ...args], {
      encoding: "utf8",
      env,
      stdio: ["ignore", "pipe", "inherit"],
    });
    if (r.error || r.status === 3) {
      console.error(
        "bench:native --rl needs PyTorch, the competitor it measures against, in " +
          `${opts.python}${r.error ? " (not found)" : ""} (pass --python PATH).`,
      );
      process.exit(1);
    }
    if (r.status !== 0) throw new Error(`torch_rl.py ${args[0]} failed (exit ${r.status})`);
    return r.stdout;
  };
  const lastLine = (text: string) => text.trim().split("\n").pop() ?? "";

  let trainer: string;
  try {
    trainer = nativeExecutable("searchr1-trainer");
  } catch (err) {
    if (!(err instanceof CliError)) throw err;
    console.error(`bench:native: ${err.message}`);
    process.exit(1);
  }
  const versions = JSON.parse(python(["check"])) as {
    torch: string;
    python: string;
    blas: string;
  };
  const cpu = cpus()[0]?.model.trim() ?? "unknown CPU";
  const loadBefore = loadavg()[0] as number;
  const work = mkdtempSync(join(tmpdir(), "searchr1-bench-rl-"));
  try {
    log(`RL: writing a random ${shape.name} model and a GRPO batch to ${work} ...`);
    const made = JSON.parse(
      lastLine(
        python([
          "make",
          "--out",
          work,
          ...shapeArgs(shape),
          "--batch",
          String(BATCH),
          "--seq",
          String(T),
          "--group",
          String(GROUP),
        ]),
      ),
    ) as { params: number; real_tokens: number; loss_tokens: number; lengths: number[] };
    const data = join(work, "rl.safetensors");
    const model = join(work, "model");

    // Whether this trainer's update_actor takes remove_padding (an unknown field is refused
    // by name, before anything else is looked at).
    const probe = new Serve(trainer, opts.threads, env);
    const answer = await probe.send({ op: "update_actor", remove_padding: true });
    await probe.close();
    const canRemove = !String(answer.reply.error ?? "").includes("remove_padding");
    let runs = new Map<string, Run>(); // by contestant name, in the order they ran

    const nativeRun = async (name: string, removePadding: boolean): Promise<Contestant> => {
      const serve = new Serve(trainer, opts.threads, env);
      await serve.must({
        op: "load",
        policy: model,
        actor_optim: { lr: LR, weight_decay: WEIGHT_DECAY, grad_clip: GRAD_CLIP },
      });
      return {
        name,
        update: async () => {
          const { reply, seconds, cpuSeconds } = await serve.must({
            op: "update_actor",
            batch: data,
            clip_ratio: 0.2,
            clip_ratio_c: 3.0,
            kl_loss_type: "low_var_kl",
            kl_loss_coef: 0.001,
            entropy_coeff: 0,
            loss_agg_mode: "token-mean",
            ppo_mini_batch_size: 0,
            ppo_epochs: 1,
            ppo_max_token_len_per_gpu: budget,
            shuffle: false,
            ...(canRemove ? { remove_padding: removePadding } : {}),
          });
          return { ...(reply as unknown as Update), seconds, cpu_seconds: cpuSeconds };
        },
        close: () => serve.close(),
      };
    };
    const torchRun = async (name: string, removePadding: boolean): Promise<Contestant> => {
      const child = new LineChild(
        "torch_rl.py",
        opts.python,
        [
          script,
          "update",
          "--stdin",
          "--model",
          model,
          "--data",
          data,
          "--steps",
          String(1 + opts.steps),
          "--threads",
          String(opts.threads),
          "--budget",
          String(budget),
          "--attention",
          opts.attention,
          "--lr",
          String(LR),
          "--weight-decay",
          String(WEIGHT_DECAY),
          "--max-grad-norm",
          String(GRAD_CLIP),
          ...(removePadding ? ["--remove-padding"] : []),
        ],
        env,
      );
      await child.next(); // {"ready": true}: the model is loaded
      return {
        name,
        // torch_rl.py times its own update (and its CPU time).
        update: async () => JSON.parse((await child.request("")).reply),
        close: () => child.close(),
      };
    };

    // All runs are started first, then their updates are interleaved round by round, so
    // that the load other work puts on the machine falls on all of them alike.
    const contestants: Contestant[] = [];
    try {
      log("RL: starting searchr1-trainer serve and torch_rl.py, padded and padding removed ...");
      contestants.push(await nativeRun("native padded", false));
      contestants.push(await torchRun("torch padded", false));
      if (canRemove) contestants.push(await nativeRun("native padding removed", true));
      contestants.push(await torchRun("torch padding removed", true));
      const updates: Update[][] = contestants.map(() => []);
      for (let round = 0; round <= opts.steps; round++) {
        for (const [i, c] of contestants.entries()) {
          log(
            `RL: round ${round + 1} of ${1 + opts.steps}${round === 0 ? " (warm-up)" : ""}: ${c.name} ...`,
          );
          // Let the previous run's idle threads stop spinning before this one starts.
          await new Promise((resolve) => setTimeout(resolve, 300));
          updates[i]?.push(await c.update());
        }
      }
      runs = new Map(
        contestants.map((c, i) => [c.name, summarize(updates[i] ?? [], opts.steps, c.name)]),
      );
    } finally {
      for (const c of contestants) await c.close();
    }
    const get = (name: string) => runs.get(name);
    const nativePadded = get("native padded") as Run;
    const torchPadded = get("torch padded") as Run;
    const nativeRemoved = get("native padding removed");
    const torchRemoved = get("torch padding removed") as Run;

    const real = made.real_tokens;
    const lengths = [...made.lengths].sort((a, b) => a - b);
    const rate = (r: Run) => fmt(real / r.median);
    const row = (name: string, ours: Run | undefined, theirs: Run) => [
      name,
      ours ? ours.median.toFixed(2) : "—",
      ours ? rate(ours) : "—",
      theirs.median.toFixed(2),
      rate(theirs),
      ours ? `${(theirs.median / ours.median).toFixed(2)}×` : "—",
      ours ? ours.cpuMedian.toFixed(2) : "—",
      theirs.cpuMedian.toFixed(2),
      ours ? `${(theirs.cpuMedian / ours.cpuMedian).toFixed(2)}×` : "—",
    ];
    const positions = (r: Run) => (r.updates[0] as Update & { positions?: number }).positions;
    const lines: string[] = [
      "",
      "## GRPO actor update, native vs PyTorch eager (CPU, fp32)",
      "",
      `Machine: ${cpu}, ${availableParallelism()} cores, ${fmt(totalmem() / 2 ** 30, 1)} GiB RAM; ` +
        `${opts.threads} threads for both sides. PyTorch ${versions.torch} (Python ` +
        `${versions.python}, BLAS ${versions.blas}), ${opts.attention === "sdpa" ? "SDPA" : "eager"} ` +
        `attention. 1-minute load average ${loadBefore.toFixed(2)} at the start, ` +
        `${(loadavg()[0] as number).toFixed(2)} at the end (other work on the machine skews the figures).`,
      `Model: ${shape.name} Qwen2 (${fmt(made.params)} params). Batch: ${BATCH} sequences ` +
        `(${BATCH / GROUP} prompts × ${GROUP}) padded to ${T}; real lengths ${lengths.join(", ")}: ` +
        `${fmt(real)} real tokens of ${fmt(BATCH * T)} (${((100 * real) / (BATCH * T)).toFixed(0)}%), ` +
        `${fmt(made.loss_tokens)} loss tokens.`,
      `Update: one mini-batch, micro-batches of at most ${budget} real tokens, PPO clip 0.2 + ` +
        "dual clip 3, low_var_kl × 0.001, token-mean, backward, clip 1.0, AdamW. tokens/s = " +
        `${fmt(real)} real tokens / the median of ${opts.steps} update` +
        `${opts.steps === 1 ? "" : "s"} after 1 warm-up.`,
      `Positions computed per update (padding included): padded ${positions(torchPadded)}, ` +
        `padding removed ${positions(torchRemoved)}; micro-batches: padded ` +
        `${nativePadded.updates[0]?.micro_batches}, removed ` +
        `${(nativeRemoved ?? torchRemoved).updates[0]?.micro_batches}.`,
      "",
      ...table(
        [
          [
            "workload",
            "native s/update",
            "native tokens/s",
            "torch s/update",
            "torch tokens/s",
            "native / torch",
            "native CPU s",
            "torch CPU s",
            "CPU ratio",
          ],
          row("padded micro-batches [rows, T], both sides", nativePadded, torchPadded),
          row("padding removed, both sides", nativeRemoved, torchRemoved),
          row("native padding removed vs torch padded", nativeRemoved, torchPadded),
        ],
        new Set([1, 2, 3, 4, 5, 6, 7, 8]),
      ),
      "",
      "native / torch = torch's median wall time / ours. CPU s: the process's median CPU time " +
        "per update (all threads); on a machine shared with other work the CPU ratio is the " +
        "steadier figure (at one thread it is the work done; at more, time spent waiting " +
        "between parallel regions counts too).",
    ];
    if (!canRemove) {
      lines.push(
        "",
        "This searchr1-trainer's update_actor has no remove_padding field: only its padded " +
          "update was measured.",
      );
    }
    lines.push(
      "",
      "Same computation? The first update (same weights, same batch) of each run:",
      "",
    );
    const ref = torchPadded.updates[0] as Update;
    const mismatches: string[] = [];
    const agreement: string[][] = [["run", "pg_loss", "kl_loss", "pg_clipfrac", "grad_norm"]];
    for (const [name, r] of runs) {
      const u = r.updates[0] as Update;
      agreement.push([
        name,
        u.pg_loss.toFixed(7),
        u.kl_loss.toFixed(7),
        u.pg_clipfrac.toFixed(5),
        u.grad_norm.toFixed(6),
      ]);
      if (
        Math.abs(u.pg_loss - ref.pg_loss) > AGREEMENT ||
        Math.abs(u.kl_loss - ref.kl_loss) > AGREEMENT ||
        Math.abs(u.grad_norm - ref.grad_norm) / ref.grad_norm > AGREEMENT
      ) {
        mismatches.push(name);
      }
    }
    lines.push(...table(agreement, new Set([1, 2, 3, 4])));
    if (mismatches.length > 0) {
      lines.push(
        "",
        `WARNING: ${mismatches.join(", ")} differ from torch padded by more than ${AGREEMENT} ` +
          "(pg_loss, kl_loss absolute; grad_norm relative): the runs do not compute the same " +
          "update, so their throughputs are not comparable.",
      );
    }
    console.log(lines.join("\n"));
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
