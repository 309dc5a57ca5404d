import { availableParallelism } from "node:os";
import { type ConfigValues, serverLine } from "../../config/command-line.js";
import { serveEngineSpec } from "../../config/schemas/serve-engine.js";
import {
  ChildServer,
  type CommandLine,
  type ServerChild,
  type StartServer,
} from "../../runtime/child-server.js";
import { UsageError } from "../../runtime/errors.js";
import { EngineRouter } from "./router.js";
import { SglangClient } from "./sglang.js";
import type { EngineClient } from "./types.js";
import { VllmClient } from "./vllm.js";

export interface EngineChoice {
  kind: "native" | "sglang" | "vllm";
  /** A running engine; null starts the native one as a child process. */
  url: string | null;
  /** The model the child engine serves. */
  modelPath: string;
  /** More `searchr1 serve-engine` config for the child (e.g. `{ device: "cpu" }`). */
  child?: ConfigValues<typeof serveEngineSpec>;
  /**
   * Native engine replicas to start, one child each (default 1; `train --gpus N` starts N):
   * the client routes among them (EngineRouter) and they share `child.threads` (all cores
   * when unset).
   */
  replicas?: number;
  /**
   * The one CUDA device each replica sees (`CUDA_VISIBLE_DEVICES`), replica 0 first; null or
   * absent: the environment as inherited (CPU replicas).
   */
  devices?: readonly string[] | null;
  /**
   * Replicas on several nodes (`train --nnodes`): where replica r listens and what starts it
   * (absent: all here, on the loopback). Threads are split among the replicas of one node.
   */
  nodes?: ReplicaNodes;
}

/** How the replicas of a multi-node run are spread: `perNode` on each node, node 0 first. */
export interface ReplicaNodes {
  perNode: number;
  /** The node replica r runs on. */
  node(replica: number): number;
  /** The address replica r listens on. */
  host(replica: number): string;
  /** What starts replica r: ChildServer.start on node 0, the node's link elsewhere. */
  start(replica: number): StartServer;
}

export interface ConnectedEngine {
  client: EngineClient;
  /** The engines this process started, replica 0 first; none for a running engine. */
  children: ServerChild[];
  /** Stops the child engines, if any. */
  stop(): Promise<void>;
}

/** The client for a running engine, or a native engine started for this run. */
export async function connectEngine(
  choice: EngineChoice,
  options: { onLine?: (line: string) => void; signal?: AbortSignal } = {},
): Promise<ConnectedEngine> {
  if (choice.url !== null) {
    const url = choice.url.replace(/\/+$/, "").replace(/\/(generate|v1\/completions)$/, "");
    const client = choice.kind === "vllm" ? new VllmClient(url) : new SglangClient(url);
    return { client, children: [], stop: async () => {} };
  }
  if (choice.kind !== "native") {
    throw new UsageError(
      `rollout.engine is ${choice.kind}: give the running server's address in ` +
        "rollout.engine_url (--engine-url); only the native engine is started here",
    );
  }
  const lines = engineChildLines(choice);
  if (lines.length === 1) {
    const child = await ChildServer.start("engine", lines[0] as CommandLine, options);
    return { client: new SglangClient(child.url), children: [child], stop: () => child.stop() };
  }
  // Replica r is "engine replica r" in every message (its death, its refusals).
  const started = await Promise.allSettled(
    lines.map((line, r) =>
      (choice.nodes?.start(r) ?? ChildServer.start)(`engine replica ${r}`, line, options),
    ),
  );
  const children = started.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
  const stop = async () => {
    await Promise.all(children.map((c) => c.stop()));
  };
  const failed = started.find((s): s is PromiseRejectedResult => s.status === "rejected");
  if (failed) {
    await stop();
    throw failed.reason;
  }
  const client = new EngineRouter(children.map((c) => new SglangClient(c.url)));
  return { client, children, stop };
}

/** The `searchr1 serve-engine` command line of the native engine started for a run. */
export function engineChildLine(
  choice: Pick<EngineChoice, "modelPath" | "child">,
  host?: string,
): CommandLine {
  return serverLine(serveEngineSpec, { model: choice.modelPath, ...choice.child }, host);
}

/**
 * The command lines of the native engine replicas started for a run, replica 0 first: each
 * one `engineChildLine`, with `child.threads` (all cores when unset) split evenly among the
 * replicas of a node, and replica r given `devices[r]` as its only visible CUDA device.
 */
export function engineChildLines(
  choice: Pick<EngineChoice, "modelPath" | "child" | "replicas" | "devices" | "nodes">,
): CommandLine[] {
  const n = choice.replicas ?? 1;
  if (!Number.isInteger(n) || n < 1) throw new Error(`engine replicas: ${n}`);
  const { devices, nodes } = choice;
  if (devices && devices.length < n) {
    throw new Error(`${n} engine replicas but ${devices.length} devices: ${devices.join(",")}`);
  }
  const given = choice.child?.threads ?? null;
  const here = Math.min(n, nodes?.perNode ?? n);
  const threads =
    here > 1 ? Math.max(1, Math.floor((given ?? availableParallelism()) / here)) : given;
  return Array.from({ length: n }, (_, r) => {
    const line = engineChildLine(
      { modelPath: choice.modelPath, child: { ...choice.child, threads: threads ?? undefined } },
      nodes?.host(r),
    );
    const device = devices?.[r];
    return device === undefined ? line : { ...line, env: { CUDA_VISIBLE_DEVICES: device } };
  });
}
