// `searchr1 train --nnodes 2`: two nodes on the loopback, each `searchr1 train` with its own
// --node-rank (two CPU "nodes" of one rank and one engine replica each stand in for two GPU
// nodes), against the same world size on one node (`--gpus 2`), with the real trainer ranks
// (Gloo), engines and retriever.
import { execFileSync } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { resolveConfig } from "../../src/config/resolve.js";
import { trainSpec } from "../../src/config/schemas/train.js";
import { BIN, type CliResult, runCli, startCli } from "../helpers/cli.js";
import { startScriptedEngine } from "../helpers/scripted-engine.js";
import { deterministic, MODEL, metrics, runDir, type SmallRun, smallRun } from "./small-run.js";

let run: SmallRun;
let dir: string;

beforeAll(() => {
  run = smallRun("searchr1-nodes-");
  dir = run.dir;
}, 60_000);

afterAll(() => run?.cleanup());

const args = (out: string, extra: string[] = []) => run.args(out, extra);

/** A port nothing listens on now. */
async function freePort(): Promise<number> {
  const server = createServer().listen(0, "127.0.0.1");
  await new Promise((r) => server.once("listening", r));
  const { port } = server.address() as { port: number };
  await new Promise((r) => server.close(r));
  return port;
}

/** `--nnodes 2` flags of node `rank`, both nodes meeting at node 0's `port`. */
const nodeFlags = (rank: number, port: number, extra: string[] = []) => [
  "--nnodes",
  "2",
  "--node-rank",
  String(rank),
  "--master-addr",
  `127.0.0.1:${port}`,
  ...extra,
];

/** The pids and command lines of `pid`'s children. */
const childrenOf = (pid: number | undefined) => {
  try {
    return execFileSync("ps", ["-o", "pid=,args=", "--ppid", String(pid)], { encoding: "utf8" });
  } catch {
    return ""; // none
  }
};

/**
 * Starts two nodes writing under `name` and waits for the first checkpoint (or node 0's
 * exit): the moment the failure tests stop one of them.
 */
async function untilFirstCheckpoint(name: string) {
  const port = await freePort();
  const out = path.join(dir, name);
  const node0 = startCli(args(out, nodeFlags(0, port)));
  const node1 = startCli(args(out, nodeFlags(1, port)));
  const checkpoint = path.join(runDir(out), "global_step_1", "controller.json");
  while (!existsSync(checkpoint) && node0.child.exitCode === null)
    await new Promise((r) => setTimeout(r, 50));
  return { out, node0, node1, checkpoint };
}

describe("searchr1 train --nnodes 2", () => {
  let oneNode: string;
  const twoNodes = () => path.join(dir, "two-nodes");

  it("two nodes of one rank and one replica each give the run of --gpus 2 on one node", async () => {
    oneNode = path.join(dir, "one-node");
    const one = runCli(args(oneNode, ["--gpus", "2"]));
    expect(one.code, one.stderr).toBe(0);
    const port = await freePort();
    const out = twoNodes();
    // Node 1 first: it keeps trying until node 0 listens.
    const node1 = startCli(args(out, nodeFlags(1, port)));
    while (!node1.output.stderr.includes("waiting for node 0") && node1.child.exitCode === null)
      await new Promise((r) => setTimeout(r, 20));
    const node0 = startCli(args(out, nodeFlags(0, port)));
    const [r0, r1] = await Promise.all([node0.result, node1.result]);
    expect(r0.code, r0.stderr).toBe(0);
    expect(r1.code, r1.stderr).toBe(0);
    expect(r1.stderr).toMatch(/^node 1: waiting for node 0 at 127\.0\.0\.1:\d+ \(ECONNREFUSED\)$/m);
    // Node 1's first rank writes each step's weights into node 1's own memory, where its
    // replica loads them (the run equals --gpus 2 below only if it did); gone at the end.
    const weights =
      /^node 1: joined node 0 at 127\.0\.0\.1:\d+; each step's weights for its replicas go to (\S+)$/m.exec(
        r1.stderr,
      )?.[1];
    expect(weights, r1.stderr).toMatch(/searchr1-node1-\d+$/);
    expect(existsSync(weights as string)).toBe(false);
    expect(r1.stdout).toBe("done: node 1 served the run to its end\n");
    expect(r0.stderr).toMatch(/^node 0: node 1 joined from 127\.0\.0\.1$/m);
    expect(r0.stderr).toMatch(/^engine replica 0 serving at http:\/\/127\.0\.0\.1:\d+ on node 0$/m);
    expect(r0.stderr).toMatch(/^engine replica 1 serving at http:\/\/127\.0\.0\.1:\d+ on node 1$/m);
    // The same world size, the same rows per rank and the same sums: the same run, bit for
    // bit, and the same answers at validation.
    expect(metrics(out).map(deterministic)).toEqual(metrics(oneNode).map(deterministic));
    for (const step of [2, 3]) {
      const file = (o: string) =>
        readFileSync(path.join(runDir(o), "validation", `step_${step}.jsonl`), "utf8");
      expect(file(out)).toBe(file(oneNode));
    }
    // The shared folder (rendezvous, batches, weights) is gone with the run.
    expect(existsSync(path.join(runDir(out), ".nodes"))).toBe(false);
    expect(existsSync(path.join(runDir(out), "global_step_3", "policy", "config.json"))).toBe(true);
  }, 300_000);

  it("resumes on one node from the checkpoint two nodes wrote", () => {
    const out = twoNodes();
    rmSync(path.join(runDir(out), "global_step_3"), { recursive: true });
    const r = runCli(args(out, ["trainer.total_training_steps=3"]));
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/resuming from .*global_step_2 \(step 2\)/);
    const last = (o: string) => deterministic(metrics(o).at(-1) as Record<string, number>);
    const [a, b] = [last(out), last(oneNode)];
    // One rank packs and sums as two do up to float rounding (test/train/train.test.ts).
    for (const key of Object.keys(b)) {
      const [x, y] = [a[key] as number, b[key] as number];
      expect(Math.abs(x - y), `${key}: ${x} vs ${y}`).toBeLessThanOrEqual(
        1e-4 * Math.max(Math.abs(y), 1),
      );
    }
  }, 240_000);

  // Two ranks a node: rank 1 is node 0's second (local rank 1, writes no weights), ranks 2
  // and 3 node 1's, rank 2 its first (writes node 1's copy, which replicas 2 and 3 load for
  // step 2's rollouts). Two steps, against --gpus 4.
  it("two nodes of two ranks and two replicas each give the run of --gpus 4 on one node", async () => {
    const short = ["trainer.total_training_steps=2", "trainer.val_before_train=false"];
    const oneNode4 = path.join(dir, "one-node-4");
    const one = runCli(args(oneNode4, ["--gpus", "4", ...short]));
    expect(one.code, one.stderr).toBe(0);
    const port = await freePort();
    const out = path.join(dir, "two-nodes-4");
    const node1 = startCli(args(out, nodeFlags(1, port, ["--gpus", "2", ...short])));
    const node0 = startCli(args(out, nodeFlags(0, port, ["--gpus", "2", ...short])));
    const [r0, r1] = await Promise.all([node0.result, node1.result]);
    expect(r0.code, r0.stderr).toBe(0);
    expect(r1.code, r1.stderr).toBe(0);
    for (const r of [0, 1, 2, 3]) {
      expect(r0.stderr).toMatch(
        new RegExp(
          `^engine replica ${r} serving at http://127\\.0\\.0\\.1:\\d+ on node ${r < 2 ? 0 : 1}$`,
          "m",
        ),
      );
    }
    expect(metrics(out).map(deterministic)).toEqual(metrics(oneNode4).map(deterministic));
  }, 300_000);

  it("a node that leaves (Ctrl-C there) stops the run on node 0 naming it; nothing is left", async () => {
    const { out, node0, node1, checkpoint } = await untilFirstCheckpoint("node-leaves");
    const served = childrenOf(node1.child.pid);
    expect(served).toMatch(/searchr1-trainer serve .*--rank 1 --world-size 2/);
    expect(served).toMatch(/serve-engine/);
    node1.child.kill("SIGINT");
    const [r0, r1]: CliResult[] = await Promise.all([node0.result, node1.result]);
    expect(r1.code, r1.stderr).toBe(130);
    expect(r1.stderr).toMatch(/interrupted; node 1 has left the run/);
    expect(r0.code, r0.stderr).toBe(1);
    expect(r0.stderr).toMatch(/node 1 \(127\.0\.0\.1\) left: interrupted on node 1/);
    expect(existsSync(checkpoint)).toBe(true);
    expect(execFileSync("ps", ["-eo", "args"], { encoding: "utf8" })).not.toContain(out);
  }, 240_000);

  it("with rollout.engine_url the engine there serves every node's ranks: no replicas start", async () => {
    const engine = await startScriptedEngine(
      MODEL,
      () => "<answer> an actor </answer>",
      () => -1,
    );
    try {
      const port = await freePort();
      const out = path.join(dir, "engine-url");
      const extra = [
        "rollout.engine=sglang",
        `rollout.engine_url=${engine.url}`,
        "data.val_files=[]",
        "trainer.val_before_train=false",
        "trainer.total_training_steps=2",
        "data.max_response_length=48",
      ];
      const node1 = startCli(args(out, nodeFlags(1, port, extra)));
      const node0 = startCli(args(out, nodeFlags(0, port, extra)));
      const [r0, r1] = await Promise.all([node0.result, node1.result]);
      expect(r0.code, r0.stderr).toBe(0);
      expect(r1.code, r1.stderr).toBe(0);
      expect(r0.stderr).not.toMatch(/engine replica/);
      // Rank 0 exports the new weights on node 0 each step, and the engine there loads them.
      expect(engine.weightUpdates).toBe(2);
      expect(metrics(out).map((m) => m.step)).toEqual([1, 2]);
      expect(metrics(out).every((m) => m["reward/mean"] === 1)).toBe(true);
    } finally {
      await engine.close();
    }
  }, 240_000);

  it("Ctrl-C on node 0 stops every node, each saying why; nothing is left", async () => {
    const { out, node0, node1, checkpoint } = await untilFirstCheckpoint("node0-interrupted");
    node0.child.kill("SIGINT");
    const [r0, r1] = await Promise.all([node0.result, node1.result]);
    expect(r0.code, r0.stderr).toBe(130);
    expect(r0.stderr).toMatch(/interrupted; the checkpoints in .* are intact/);
    expect(r1.code, r1.stderr).toBe(1);
    expect(r1.stderr).toMatch(/node 0 at 127\.0\.0\.1:\d+ stopped the run: interrupted on node 0/);
    expect(existsSync(checkpoint)).toBe(true);
    expect(execFileSync("ps", ["-eo", "args"], { encoding: "utf8" })).not.toContain(out);
  }, 240_000);

  it("a rank that dies on node 1 stops the run naming the rank and its last lines", async () => {
    const { out, node0, node1, checkpoint } = await untilFirstCheckpoint("rank-dies");
    const rank = childrenOf(node1.child.pid)
      .split("\n")
      .find((l) => l.includes("searchr1-trainer serve"));
    process.kill(Number(rank?.trim().split(/\s+/)[0]), "SIGKILL");
    const [r0, r1] = await Promise.all([node0.result, node1.result]);
    expect(r0.code, r0.stderr).toBe(1);
    expect(r0.stderr).toMatch(/the trainer's rank 1 \(searchr1-trainer serve\) died \(SIGKILL\)/);
    expect(r1.code).toBe(1);
    expect(r1.stderr).toMatch(
      /node 0 at 127\.0\.0\.1:\d+ stopped the run: the trainer's rank 1 \(searchr1-trainer serve\) died \(SIGKILL\)/,
    );
    expect(existsSync(checkpoint)).toBe(true);
    expect(execFileSync("ps", ["-eo", "args"], { encoding: "utf8" })).not.toContain(out);
  }, 240_000);

  it("refuses a node with another config naming the key, and waits for a missing node no longer than join_timeout_s", async () => {
    const port = await freePort();
    const out = path.join(dir, "refused");
    const node0 = startCli(args(out, nodeFlags(0, port)));
    const node1 = startCli(args(out, nodeFlags(1, port, ["actor.lr=2e-3"])));
    const [r0, r1] = await Promise.all([node0.result, node1.result]);
    expect(r1.code).toBe(2);
    expect(r1.stderr).toMatch(
      /its config differs from node 0's at actor\.lr \(0\.002 there, 0\.001 on node 0\): run every node with the same config/,
    );
    expect(r0.code).toBe(2);
    expect(r0.stderr).toMatch(/node 1 \(127\.0\.0\.1\) was refused: its config differs/);

    const alone = runCli(
      args(path.join(dir, "alone"), nodeFlags(0, await freePort(), ["trainer.join_timeout_s=1"])),
    );
    expect(alone.code).toBe(1);
    expect(alone.stderr).toMatch(
      /node\(s\) 1 did not join node 0 at 127\.0\.0\.1:\d+ within 1 s \(trainer\.join_timeout_s\)/,
    );
    const unreachable = runCli(
      args(
        path.join(dir, "unreachable"),
        nodeFlags(1, await freePort(), ["trainer.join_timeout_s=1"]),
      ),
    );
    expect(unreachable.code).toBe(1);
    expect(unreachable.stderr).toMatch(
      /node 0 at 127\.0\.0\.1:\d+ could not be reached within 1 s \(trainer\.join_timeout_s\): ECONNREFUSED/,
    );
    const bad = runCli(args(path.join(dir, "bad"), ["--node-rank", "1"]));
    expect(bad.code, bad.stderr).toBe(2);
    expect(bad.stderr).toMatch(
      /trainer\.node_rank=1 with trainer\.nnodes=1: the node ranks are 0 to 0/,
    );
    expect(existsSync(path.join(dir, "bad"))).toBe(false);
  }, 120_000);
});

describe("templates/slurm/train-2x8.sbatch", () => {
  it("runs one `searchr1 train` per node that meet at the allocation's first host (stand-ins for srun and scontrol)", async () => {
    const bin = path.join(dir, "slurm-bin");
    mkdirSync(bin, { recursive: true });
    // scontrol show hostnames: the allocation's hosts, one a line.
    writeFileSync(
      path.join(bin, "scontrol"),
      '#!/bin/sh\necho "$SLURM_JOB_NODELIST" | tr , "\\n"\n',
    );
    // srun: its command once per node, each with its SLURM_NODEID, as one task per node does.
    writeFileSync(
      path.join(bin, "srun"),
      [
        "#!/bin/sh",
        // biome-ignore lint/suspicious/noTemplateCurlyInString: shell text, not a template
        'while [ "${1#--}" != "$1" ]; do shift; done',
        "i=0; pids=",
        'while [ $i -lt "$SLURM_NNODES" ]; do SLURM_NODEID=$i "$@" & pids="$pids $!"; i=$((i+1)); done',
        "status=0; for p in $pids; do wait $p || status=$?; done; exit $status",
        "",
      ].join("\n"),
    );
    for (const f of ["scontrol", "srun"]) chmodSync(path.join(bin, f), 0o755);
    const config = path.join(dir, "slurm.yaml");
    writeFileSync(config, "trainer:\n  total_training_steps: 1\n  val_before_train: false\n");
    const out = path.join(dir, "slurm-run");
    const small = args(out).slice(5); // the run's overrides, without train --model --output-dir
    const r = execFileSync(
      "bash",
      [
        path.join(import.meta.dirname, "../../templates/slurm/train-2x8.sbatch"),
        ...small,
        "trainer.total_training_steps=1",
      ],
      {
        encoding: "utf8",
        stdio: ["ignore", "pipe", "pipe"],
        env: {
          ...process.env,
          PATH: `${bin}:${process.env.PATH}`,
          SLURM_JOB_NODELIST: "127.0.0.1,127.0.0.1",
          SLURM_NNODES: "2",
          SLURM_GPUS_ON_NODE: "1",
          MASTER_PORT: String(await freePort()),
          CONFIG: config,
          MODEL,
          OUTPUT_DIR: out,
          SEARCHR1: `${process.execPath} ${BIN}`,
        },
      },
    );
    expect(r).toContain("done: node 1 served the run to its end\n");
    expect(r).toContain(`done: ${runDir(out)} (metrics.jsonl`);
    expect(metrics(out).map((m) => m.step)).toEqual([1]);
  }, 120_000);
});

describe("the nodes' settings", () => {
  it("come from torchrun's flags and variables, and from SLURM's inside an allocation", () => {
    const slurm = resolveConfig(trainSpec, {
      overrides: ["model.path=/m"],
      env: { SLURM_NNODES: "2", SLURM_NODEID: "1", MASTER_ADDR: "node0", MASTER_PORT: "29511" },
    });
    expect(slurm.trainer).toMatchObject({
      nnodes: 2,
      node_rank: 1,
      master_addr: "node0",
      master_port: 29511,
    });
    const flags = resolveConfig(trainSpec, {
      overrides: ["model.path=/m"],
      cli: [
        { key: "trainer.nnodes", value: "2", origin: { kind: "flag", flag: "--nnodes" } },
        { key: "trainer.node_rank", value: "0", origin: { kind: "flag", flag: "--node-rank" } },
        {
          key: "trainer.master_addr",
          value: "h:1234",
          origin: { kind: "flag", flag: "--master-addr" },
        },
      ],
      env: { SLURM_NNODES: "4" },
    });
    expect(flags.trainer).toMatchObject({ nnodes: 2, node_rank: 0, master_addr: "h:1234" });
  });
});
