import { mkdirSync } from "node:fs";
import { join } from "node:path";
import type { EngineReplicas } from "../agent/session.js";
import { rawConfig } from "../config/key-reads.js";
import type { TrainConfig } from "../config/schemas/train.js";
import { NodeMaster } from "../nodes/master.js";
import { masterAddress, type NodeDevices, type NodeSide } from "../nodes/protocol.js";
import { runNodeWorker } from "../nodes/worker.js";
import { ChildServer } from "../runtime/child-server.js";
import { UsageError } from "../runtime/errors.js";
import { packageVersion } from "../runtime/package-root.js";
import type { RankNodes } from "../trainer/group.js";
import { type Placement, placeRun } from "./placement.js";

/**
 * The nodes of a multi-node run as node 0 uses them: the trainer ranks (trainer.gpus per
 * node, node 0's first) and the engine replicas (as many per node) with their devices, where
 * each listens and what starts it; the shared folder under the run folder (the rendezvous,
 * the batch files: every node must mount it).
 */
export interface RunNodes {
  master: NodeMaster;
  ranks: RankNodes;
  /** The trainer ranks' devices over every node, rank 0 first; null on the CPU. */
  rankDevices: string[] | null;
  /** The engine: the native replicas over every node, or the one at engine_url. */
  engine: EngineReplicas;
  /** With native replicas: where each node's copy of each step's weights goes. */
  exports?: NodeExports;
  /** The folder every node reads and writes. */
  shared: string;
}

/**
 * Each step's weights on several nodes: every node's first trainer rank writes a copy in the
 * node's own memory (`roots[node]`, node 0's the run's exports folder) and the node's replicas
 * load it, so no weights cross the network or the shared filesystem.
 */
export interface NodeExports {
  roots: string[];
  replicaNode(replica: number): number;
  /** Removes an earlier step's folder on the other nodes. */
  removeElsewhere(name: string): void;
  /** The trainer's compute type, the only one every rank holds whole. */
  dtype: "fp32" | "bf16";
}

/**
 * Where node 0 listens and how long the nodes wait for each other (null on one node), and
 * the refusals of keys that cannot work together.
 */
export function checkNodes(
  config: TrainConfig,
): { host: string; port: number; timeoutMs: number } | null {
  const { nnodes, node_rank, master_addr, master_port, join_timeout_s } = config.trainer;
  if (node_rank >= nnodes) {
    throw new UsageError(
      `trainer.node_rank=${node_rank} with trainer.nnodes=${nnodes}: the node ranks are 0 to ${nnodes - 1}`,
    );
  }
  if (nnodes === 1) return null;
  if (master_addr === null) {
    throw new UsageError(
      `trainer.nnodes=${nnodes} needs trainer.master_addr (--master-addr HOST[:PORT], or MASTER_ADDR): ` +
        "node 0's address, which every node reaches",
    );
  }
  return { ...masterAddress(master_addr, master_port), timeoutMs: join_timeout_s * 1000 };
}

/** What a node tells node 0 of its devices. */
export function nodeDevices(placement: Placement): NodeDevices {
  return {
    trainer: { device: placement.trainer.device, devices: placement.trainer.devices },
    engine: {
      replicas: placement.engine.replicas,
      device: placement.engine.device,
      devices: placement.engine.devices,
    },
  };
}

/** What this node tells the others and is told of them (nodes/protocol.ts NodeSide). */
function nodeSide(
  config: TrainConfig,
  placement: Placement,
  log: (line: string) => void,
  signal: AbortSignal,
): NodeSide {
  const address = checkNodes(config);
  if (!address) throw new Error("several nodes need trainer.nnodes > 1");
  return {
    ...address,
    nnodes: config.trainer.nnodes,
    version: packageVersion(),
    // The resolved config, as every node compares it.
    config: JSON.parse(JSON.stringify(rawConfig(config))),
    devices: nodeDevices(placement),
    log,
    signal,
  };
}

/**
 * Node 0: waits for every other node, then says where each rank and replica runs. `runDir`
 * must be on a filesystem every node mounts (`shared` goes in it).
 */
export async function openNodes(
  config: TrainConfig,
  placement: Placement,
  runDir: string,
  exportsDir: string,
  log: (line: string) => void,
  signal: AbortSignal,
): Promise<RunNodes> {
  const { gpus, nnodes } = config.trainer;
  const master = await NodeMaster.open(nodeSide(config, placement, log, signal));
  const shared = join(runDir, ".nodes");
  mkdirSync(shared, { recursive: true });
  const perNode = (node: number): NodeDevices =>
    node === 0 ? nodeDevices(placement) : master.link(node).devices;
  const hostOf = (node: number) => (node === 0 ? master.host : master.link(node).host);
  const all = (pick: (d: NodeDevices) => string[] | null): string[] | null => {
    const lists = Array.from({ length: nnodes }, (_, k) => pick(perNode(k)));
    return lists.every((l) => l !== null) ? lists.flat() : null;
  };
  const replicasPerNode = placement.engine.replicas;
  const nativeReplicas = config.rollout.engine === "native" && config.rollout.engine_url === null;
  const replicaNode = (r: number) => Math.floor(r / replicasPerNode);
  const rankNode = (rank: number) => Math.floor(rank / gpus);
  return {
    master,
    shared,
    ranks: {
      perNode: gpus,
      host: (rank) => hostOf(rankNode(rank)),
      spawn: (rank) => (rankNode(rank) === 0 ? undefined : master.link(rankNode(rank)).spawn),
      shared,
    },
    rankDevices: all((d) => d.trainer.devices),
    engine: nativeReplicas
      ? {
          ...placement.engine,
          replicas: replicasPerNode * nnodes,
          devices: all((d) => d.engine.devices),
          nodes: {
            perNode: replicasPerNode,
            node: replicaNode,
            host: (r) => hostOf(replicaNode(r)),
            start: (r) => {
              const node = replicaNode(r);
              return node === 0 ? ChildServer.start : master.link(node).startServer;
            },
          },
        }
      : placement.engine,
    ...(nativeReplicas && {
      exports: {
        roots: Array.from({ length: nnodes }, (_, k) =>
          k === 0 ? exportsDir : master.link(k).exports,
        ),
        replicaNode,
        removeElsewhere: (name: string) => {
          for (let k = 1; k < nnodes; k++) master.link(k).removeExport(name);
        },
        dtype: placement.trainer.device === "cuda" ? ("bf16" as const) : ("fp32" as const),
      },
    }),
  };
}

/**
 * Node k > 0 of a multi-node run: decides its own devices, joins node 0 and serves it until
 * the run is over. The config must be node 0's but for trainer.node_rank.
 */
export async function runNode(
  config: TrainConfig,
  log: (line: string) => void,
  signal: AbortSignal,
): Promise<void> {
  const placement = await placeRun(config);
  for (const note of placement.notes) log(note);
  await runNodeWorker({
    ...nodeSide(config, placement, log, signal),
    node: config.trainer.node_rank,
  });
}
