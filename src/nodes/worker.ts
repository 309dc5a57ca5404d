import { once } from "node:events";
import { existsSync, mkdirSync, rmSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { createInterface } from "node:readline";
import { ChildServer, type ServerChild } from "../runtime/child-server.js";
import { ServiceError, UsageError } from "../runtime/errors.js";
import { type NativeExecutable, nativeExecutable } from "../runtime/native-executable.js";
import { type ProcessHandle, spawnLocal } from "../runtime/process-handle.js";
import { type NodeSide, receive, send, type ToMaster, type ToNode } from "./protocol.js";

export interface NodeWorkerOptions extends NodeSide {
  /** This node's rank (1 to nnodes − 1). */
  node: number;
}

/** The programs node 0 may start here, and the commands it may serve: nothing else runs. */
const PROGRAMS: ReadonlySet<string> = new Set<NativeExecutable>(["searchr1-trainer"]);
const SERVERS = new Set(["serve-engine"]);
const RETRY_MS = 1000;

/**
 * Node k > 0 of a multi-node `train`: joins node 0 and, until node 0 says the run is done,
 * runs the trainer ranks and engine replicas it asks for, relaying their stdio, lines and
 * ends. Resolves when node 0 says the run succeeded; rejects when it failed, when node 0 goes
 * away, or on Ctrl-C here (node 0 is told why, and every process started here is stopped).
 */
export async function runNodeWorker(o: NodeWorkerOptions): Promise<void> {
  const socket = await reach(o);
  // Each step's weights for this node's replicas, written by its first rank: in memory.
  const exports = join(
    existsSync("/dev/shm") ? "/dev/shm" : tmpdir(),
    `searchr1-node${o.node}-${process.pid}`,
  );
  mkdirSync(exports, { recursive: true });
  try {
    await serveNode(o, socket, exports);
  } finally {
    rmSync(exports, { recursive: true, force: true });
  }
}

async function serveNode(o: NodeWorkerOptions, socket: Socket, exports: string): Promise<void> {
  const processes = new Map<number, ProcessHandle>();
  const servers = new Map<number, Promise<ServerChild | null>>();
  const stopAll = async () => {
    for (const p of processes.values()) p.kill("SIGTERM");
    await Promise.all([
      ...[...processes.values()].map((p) => p.ended),
      ...[...servers.values()].map(async (s) => (await s)?.stop()),
    ]);
  };
  send(socket, {
    t: "hello",
    node: o.node,
    nnodes: o.nnodes,
    version: o.version,
    config: o.config,
    devices: o.devices,
    exports,
  });
  const where = `node 0 at ${o.host}:${o.port}`;
  type Outcome = { ok: true } | { ok: false; err: Error };
  const outcome = await new Promise<Outcome>((end) => {
    const abort = () => {
      send(socket, { t: "leaving", why: `interrupted on node ${o.node}` });
      end({ ok: false, err: new ServiceError(`interrupted; ${where} is told`) });
    };
    o.signal.addEventListener("abort", abort, { once: true });
    socket.on("close", () =>
      end({
        ok: false,
        err: new ServiceError(
          `${where} closed the connection: the run stopped there (see its output)`,
        ),
      }),
    );
    receive<ToNode>(
      socket,
      (m) => {
        if (m.t === "welcome")
          o.log(
            `node ${o.node}: joined ${where}; each step's weights for its replicas go to ${exports}`,
          );
        else if (m.t === "refused") end({ ok: false, err: new UsageError(m.message) });
        else if (m.t === "done")
          end(
            m.stopped === null
              ? { ok: true }
              : { ok: false, err: new ServiceError(`${where} stopped the run: ${m.stopped}`) },
          );
        else obey(m);
      },
      () => {},
    );
  });

  function obey(m: Exclude<ToNode, { t: "welcome" | "refused" | "done" }>): void {
    switch (m.t) {
      case "spawn": {
        if (!PROGRAMS.has(m.program)) {
          send(socket, { t: "ended", id: m.id, cause: `node ${o.node} runs no ${m.program}` });
          return;
        }
        const p = spawnLocal(nativeExecutable(m.program as NativeExecutable), m.args, m.env);
        processes.set(m.id, p);
        relay(socket, m.id, p);
        return;
      }
      case "in":
        processes.get(m.id)?.stdin.write(m.data);
        return;
      case "in_end":
        processes.get(m.id)?.stdin.end();
        return;
      case "kill":
        processes.get(m.id)?.kill(m.signal);
        return;
      case "serve": {
        if (!SERVERS.has(m.line.command)) {
          send(socket, {
            t: "server_failed",
            id: m.id,
            message: `node ${o.node} serves no ${m.line.command}`,
          });
          return;
        }
        const id = m.id;
        const started = ChildServer.start(m.name, m.line, {
          onLine: (line) => send(socket, { t: "server_line", id, line }),
        }).then(
          (server) => {
            server.onDeath((message) => send(socket, { t: "server_died", id, message }));
            send(socket, { t: "serving", id, url: server.url });
            return server;
          },
          (err: Error) => {
            send(socket, { t: "server_failed", id, message: err.message });
            return null;
          },
        );
        servers.set(id, started);
        return;
      }
      case "remove_export":
        rmSync(join(exports, basename(m.name)), { recursive: true, force: true });
        return;
      case "stop_server": {
        const id = m.id;
        void servers.get(id)?.then(async (server) => {
          await server?.stop();
          send(socket, { t: "server_stopped", id });
        });
        return;
      }
    }
  }

  // Node 0 hears of this node's end (and why) before its processes stop.
  socket.end();
  await stopAll();
  if (!outcome.ok) throw outcome.err;
}

/** Connects to node 0, trying again every second until it listens or the time is up. */
async function reach(o: NodeWorkerOptions): Promise<Socket> {
  const until = Date.now() + o.timeoutMs;
  let waiting = false;
  for (;;) {
    if (o.signal.aborted)
      throw new ServiceError(`interrupted while reaching node 0 at ${o.host}:${o.port}`);
    const socket = connect(o.port, o.host);
    try {
      await once(socket, "connect");
      socket.setNoDelay(true);
      return socket;
    } catch (e) {
      socket.destroy();
      const err = e as NodeJS.ErrnoException;
      if (Date.now() >= until) {
        throw new ServiceError(
          `node 0 at ${o.host}:${o.port} could not be reached within ${o.timeoutMs / 1000} s ` +
            `(trainer.join_timeout_s): ${err.code ?? err.message}; start \`searchr1 train\` there with --node-rank 0`,
        );
      }
      if (!waiting)
        o.log(
          `node ${o.node}: waiting for node 0 at ${o.host}:${o.port} (${err.code ?? err.message})`,
        );
      waiting = true;
      await new Promise((r) => setTimeout(r, RETRY_MS));
    }
  }
}

/** Relays a process's stdout and stderr lines, then its end, to node 0 under `id`. */
function relay(socket: Socket, id: number, p: ProcessHandle): void {
  p.started.then(
    () => send(socket, { t: "started", id, pid: p.pid ?? null }),
    () => {},
  );
  const closed = (stream: NodeJS.ReadableStream, t: "out" | "err") =>
    new Promise<void>((resolve) => {
      createInterface({ input: stream })
        .on("line", (line) => send(socket, { t, id, line }))
        .on("close", resolve);
    });
  const streams = Promise.all([closed(p.stdout, "out"), closed(p.stderr, "err")]);
  void p.ended.then(async (end) => {
    if (end.signal !== undefined || end.exitCode !== undefined) await streams;
    send(socket, { t: "ended", id, ...end } as ToMaster);
  });
}
