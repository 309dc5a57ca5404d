import type { Socket } from "node:net";
import { createInterface } from "node:readline";
import type { CommandLine } from "../runtime/child-server.js";

/**
 * The messages between node 0 of a multi-node `train` (the controller) and each other node,
 * one JSON object per line over one TCP connection that the node opens to
 * `--master-addr`. The node says hello; node 0 welcomes or refuses it; from then on node 0
 * asks it to start trainer ranks (`spawn`, their stdio relayed line by line under the id node
 * 0 gave) and engine replicas (`serve`), and ends with `done`. A connection that closes
 * before `done` ends the run on both sides: node 0 sees every process of that node gone, the
 * node stops them.
 */

/** What a node decided for its own devices (train/placement.ts, run on that node). */
export interface NodeDevices {
  trainer: { device: string; devices: string[] | null };
  engine: { replicas: number; device?: string; devices: string[] | null };
}

/** What every node of a run knows of it and itself, node 0 included. */
export interface NodeSide {
  nnodes: number;
  /** Node 0's address (trainer.master_addr and master_port): where it listens. */
  host: string;
  port: number;
  /** How long node 0 waits for the others to join, and they try to reach it. */
  timeoutMs: number;
  /** This package's version: every node must run the same. */
  version: string;
  /** The node's resolved config: every node's must be node 0's but for trainer.node_rank. */
  config: unknown;
  /** The node's devices: every node must have decided the same kinds. */
  devices: NodeDevices;
  log: (line: string) => void;
  signal: AbortSignal;
}

export type ToMaster =
  | {
      t: "hello";
      node: number;
      nnodes: number;
      version: string;
      /** The node's resolved config, compared key by key with node 0's. */
      config: unknown;
      devices: NodeDevices;
      /** A folder of the node's own (in memory) where its first rank writes each step's weights. */
      exports: string;
    }
  | { t: "started"; id: number; pid: number | null }
  | { t: "out"; id: number; line: string }
  | { t: "err"; id: number; line: string }
  | { t: "ended"; id: number; exitCode?: number; signal?: string; cause?: string }
  | { t: "serving"; id: number; url: string }
  | { t: "server_line"; id: number; line: string }
  | { t: "server_failed"; id: number; message: string }
  | { t: "server_died"; id: number; message: string }
  | { t: "server_stopped"; id: number }
  /** The node stops (Ctrl-C there): why, before its connection closes. */
  | { t: "leaving"; why: string };

export type ToNode =
  | { t: "welcome" }
  | { t: "refused"; message: string }
  /** Start a trainer rank: `searchr1-trainer` on that node with these arguments. */
  | { t: "spawn"; id: number; program: string; args: string[]; env?: Record<string, string> }
  | { t: "in"; id: number; data: string }
  | { t: "in_end"; id: number }
  | { t: "kill"; id: number; signal: "SIGTERM" | "SIGKILL" }
  /** Start a server (an engine replica) from its command line; `name` names it in messages. */
  | { t: "serve"; id: number; name: string; line: CommandLine }
  | { t: "stop_server"; id: number }
  /** Remove an earlier step's weights (a folder in the node's `exports`, by name). */
  | { t: "remove_export"; name: string }
  /** The run is over (`stopped`: why it failed there; null: it succeeded); the node exits. */
  | { t: "done"; stopped: string | null };

/** Sends one message; false once the connection is gone. */
export function send(socket: Socket, message: ToMaster | ToNode): boolean {
  if (socket.destroyed || !socket.writable) return false;
  socket.write(`${JSON.stringify(message)}\n`);
  return true;
}

/** Calls `on` with each message that arrives, in order; a line that is not JSON is `bad`. */
export function receive<T>(socket: Socket, on: (message: T) => void, bad: (line: string) => void) {
  createInterface({ input: socket }).on("line", (line) => {
    let message: unknown;
    try {
      message = JSON.parse(line);
    } catch {
      bad(line);
      return;
    }
    if (typeof message === "object" && message !== null && "t" in message) on(message as T);
    else bad(line);
  });
}

/** "HOST:PORT" (or "[v6]:PORT") of master_addr and master_port. */
export function masterAddress(addr: string, port: number): { host: string; port: number } {
  const m = /^\[([^\]]+)\](?::(\d+))?$/.exec(addr) ?? /^([^:]+)(?::(\d+))?$/.exec(addr);
  if (!m) return { host: addr, port };
  return { host: m[1] as string, port: m[2] === undefined ? port : Number(m[2]) };
}
