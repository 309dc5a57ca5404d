import { once } from "node:events";
import { createServer, type Server, type Socket } from "node:net";
import { basename } from "node:path";
import { PassThrough, Writable } from "node:stream";
import { type ServerChild, type StartServer, within } from "../runtime/child-server.js";
import { ServiceError, UsageError } from "../runtime/errors.js";
import { listenError } from "../runtime/http-server.js";
import type { ProcessEnd, ProcessHandle, Spawn } from "../runtime/process-handle.js";
import { configDiff } from "./config-diff.js";
import { type NodeDevices, type NodeSide, receive, send, type ToMaster } from "./protocol.js";

export type NodeMasterOptions = NodeSide;

/** Config keys that differ from node to node. */
const PER_NODE = new Set(["trainer.node_rank"]);

/**
 * Node 0 of a multi-node run: listens at trainer.master_addr, waits until nodes 1 to N − 1
 * have joined (each with the same version and config, and the same kinds of device), then
 * starts processes on them through their links (trainer ranks, engine replicas).
 */
export class NodeMaster {
  private constructor(
    private readonly server: Server,
    /** Node k's link at k − 1. */
    private readonly links: NodeLink[],
    /** The address the other nodes reach node 0 at. */
    readonly host: string,
  ) {}

  /** Listens and waits for every node; rejects naming the node that was refused or is missing. */
  static async open(o: NodeMasterOptions): Promise<NodeMaster> {
    const server = createServer();
    server.listen(o.port, o.host);
    try {
      await once(server, "listening");
    } catch (e) {
      throw new UsageError(
        `${listenError(e as NodeJS.ErrnoException, o.host, o.port, "another run").message} ` +
          "(trainer.master_addr names node 0, where this run listens for the other nodes)",
      );
    }
    const links = new Map<number, NodeLink>();
    let ownHost = o.host;
    const others = o.nnodes - 1;
    o.log(`node 0: waiting for ${others} more node(s) at ${o.host}:${o.port}`);
    try {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => {
          const missing = Array.from({ length: others }, (_, i) => i + 1).filter(
            (k) => !links.has(k),
          );
          reject(
            new ServiceError(
              `node(s) ${missing.join(", ")} did not join node 0 at ${o.host}:${o.port} within ` +
                `${o.timeoutMs / 1000} s (trainer.join_timeout_s): start \`searchr1 train\` ` +
                "there with the same config and --nnodes, --node-rank and --master-addr",
            ),
          );
        }, o.timeoutMs);
        const abort = () => reject(new ServiceError("interrupted while waiting for the nodes"));
        o.signal.addEventListener("abort", abort, { once: true });
        const finish = (err?: Error) => {
          clearTimeout(timer);
          o.signal.removeEventListener("abort", abort);
          if (err) reject(err);
          else resolve();
        };
        server.on("connection", (socket) => {
          socket.setNoDelay(true);
          const from = plainAddress(socket.remoteAddress);
          // The hello, then every later message to the node's link.
          let greeted = false;
          let link: NodeLink | null = null;
          receive<ToMaster>(
            socket,
            (m) => {
              if (greeted) {
                link?.receive(m);
                return;
              }
              greeted = true;
              if (m.t !== "hello") {
                socket.destroy();
                return;
              }
              const why = refusal(m, o, links);
              if (why) {
                send(socket, { t: "refused", message: why });
                socket.end();
                finish(new UsageError(`node ${m.node} (${from}) was refused: ${why}`));
                return;
              }
              ownHost = plainAddress(socket.localAddress);
              link = new NodeLink(m.node, from, m.devices, m.exports, socket);
              links.set(m.node, link);
              send(socket, { t: "welcome" });
              o.log(`node 0: node ${m.node} joined from ${from}`);
              if (links.size === others) finish();
            },
            () => socket.destroy(),
          );
          socket.on("error", () => {});
        });
      });
    } catch (err) {
      for (const link of links.values()) link.close((err as Error).message);
      server.close();
      throw err;
    }
    // Late or extra connections are not part of this run.
    server.removeAllListeners("connection");
    server.on("connection", (socket) => socket.destroy());
    const ordered = Array.from({ length: others }, (_, i) => links.get(i + 1) as NodeLink);
    return new NodeMaster(server, ordered, ownHost);
  }

  /** Node k's link (k ≥ 1). */
  link(node: number): NodeLink {
    const link = this.links[node - 1];
    if (!link) throw new Error(`no node ${node}`);
    return link;
  }

  /** Tells every node the run is over (`stopped`: why it failed; null: it succeeded). */
  close(stopped: string | null): void {
    for (const link of this.links) link.close(stopped);
    this.server.close();
  }
}

/** Why a node's hello is refused; null to welcome it. */
function refusal(
  m: Extract<ToMaster, { t: "hello" }>,
  o: NodeMasterOptions,
  links: ReadonlyMap<number, NodeLink>,
): string | null {
  if (m.nnodes !== o.nnodes)
    return `it has trainer.nnodes=${m.nnodes}, node 0 has ${o.nnodes}: give every node the same`;
  if (!Number.isInteger(m.node) || m.node < 1 || m.node >= o.nnodes)
    return `trainer.node_rank=${m.node} is not one of 1 to ${o.nnodes - 1}`;
  const twin = links.get(m.node);
  if (twin)
    return `node ${m.node} has already joined (from ${twin.host}): give each node its own --node-rank`;
  if (m.version !== o.version)
    return `it runs searchr1 ${m.version}, node 0 runs ${o.version}: install the same on every node`;
  const diff = configDiff(o.config, m.config, PER_NODE);
  if (diff.length) {
    const shown = diff
      .slice(0, 5)
      .map((d) => `${d.key} (${JSON.stringify(d.b)} there, ${JSON.stringify(d.a)} on node 0)`);
    return (
      `its config differs from node 0's at ${shown.join(", ")}` +
      `${diff.length > 5 ? ` and ${diff.length - 5} more key(s)` : ""}: run every node with the same config`
    );
  }
  const [mine, theirs] = [o.devices, m.devices];
  if (theirs.trainer.device !== mine.trainer.device || theirs.engine.device !== mine.engine.device)
    return (
      `its trainer and engine run on ${theirs.trainer.device} and ${theirs.engine.device ?? "as configured"}, ` +
      `node 0's on ${mine.trainer.device} and ${mine.engine.device ?? "as configured"}: every node needs the same kind of device`
    );
  return null;
}

/** An IPv4 address as it is written (not `::ffff:` mapped). */
function plainAddress(address: string | undefined): string {
  return (address ?? "127.0.0.1").replace(/^::ffff:(\d+\.\d+\.\d+\.\d+)$/, "$1");
}

interface Remote {
  process?: RemoteProcess;
  server?: RemoteServer;
}

/**
 * Node 0's end of one node's connection: starts trainer ranks and servers there and relays
 * their stdio and their ends. If the node leaves before the run is over, every process it ran
 * ends, naming the node and why.
 */
export class NodeLink {
  private readonly remotes = new Map<number, Remote>();
  private nextId = 1;
  private leftWhy: string | null = null;
  /** Why the node says it is leaving (Ctrl-C there), before its connection closes. */
  private leaving = "its connection closed";
  private done = false;

  constructor(
    readonly node: number,
    /** The node's address, as node 0 sees it: its ranks and servers listen there. */
    readonly host: string,
    readonly devices: NodeDevices,
    /** The node's folder for the weights its replicas load. */
    readonly exports: string,
    private readonly socket: Socket,
  ) {
    socket.on("close", () => this.left(this.leaving));
  }

  /** Starts `basename(executable)` on the node (a searchr1 native program), stdio relayed. */
  readonly spawn: Spawn = (executable, args, env) => {
    const id = this.nextId++;
    const process = new RemoteProcess(id, this.socket);
    this.remotes.set(id, { process });
    if (this.leftWhy) process.end({ cause: this.leaveMessage() });
    else send(this.socket, { t: "spawn", id, program: basename(executable), args: [...args], env });
    return process;
  };

  /** Starts a `searchr1 serve-*` command line on the node; resolves once it serves. */
  readonly startServer: StartServer = (name, line, options = {}) => {
    const id = this.nextId++;
    const server = new RemoteServer(
      id,
      `${name} on node ${this.node}`,
      this.socket,
      options.onLine,
    );
    this.remotes.set(id, { server });
    if (this.leftWhy) server.die(`the ${server.name} could not start: ${this.leaveMessage()}`);
    else send(this.socket, { t: "serve", id, name: server.name, line });
    return server.ready;
  };

  /** Removes the folder `name` from the node's exports. */
  removeExport(name: string): void {
    send(this.socket, { t: "remove_export", name });
  }

  /** Ends the run on the node: it stops what is left and exits (0 when `stopped` is null). */
  close(stopped: string | null): void {
    this.done = true;
    send(this.socket, { t: "done", stopped });
    this.socket.end();
  }

  /** A message from the node after its hello. */
  receive(m: ToMaster): void {
    if (m.t === "leaving") this.leaving = m.why;
    if (m.t === "hello" || m.t === "leaving") return;
    const remote = this.remotes.get(m.id);
    if (!remote) return;
    const { process, server } = remote;
    switch (m.t) {
      case "started":
        process?.begin(m.pid);
        break;
      case "out":
        process?.stdout.write(`${m.line}\n`);
        break;
      case "err":
        process?.stderr.write(`${m.line}\n`);
        break;
      case "ended":
        process?.end(m);
        break;
      case "serving":
        server?.serving(m.url);
        break;
      case "server_line":
        server?.line(m.line);
        break;
      case "server_failed":
      case "server_died":
        server?.die(m.message);
        break;
      case "server_stopped":
        server?.stopped();
        break;
    }
  }

  private leaveMessage(): string {
    return `node ${this.node} (${this.host}) left: ${this.leftWhy}`;
  }

  private left(why: string): void {
    if (this.leftWhy !== null) return;
    this.leftWhy = why;
    for (const { process, server } of this.remotes.values()) {
      process?.end({ cause: this.leaveMessage() });
      if (this.done) server?.stopped();
      else server?.die(`the ${server.name} is gone: ${this.leaveMessage()}`);
    }
  }
}

/** A process on another node as a ProcessHandle: its stdio and end relayed by the link. */
class RemoteProcess implements ProcessHandle {
  pid: number | undefined = undefined;
  readonly stdout = new PassThrough();
  readonly stderr = new PassThrough();
  readonly stdin: Writable;
  readonly ended: Promise<ProcessEnd>;
  readonly started: Promise<void>;
  private settle!: (end: ProcessEnd) => void;
  private run!: () => void;
  private fail!: (err: Error) => void;
  private over = false;

  constructor(
    private readonly id: number,
    private readonly socket: Socket,
  ) {
    this.ended = new Promise((resolve) => {
      this.settle = resolve;
    });
    this.started = new Promise((resolve, reject) => {
      this.run = resolve;
      this.fail = reject;
    });
    this.started.catch(() => {});
    this.stdin = new Writable({
      write: (chunk: Buffer, _enc, callback) => {
        send(socket, { t: "in", id, data: chunk.toString() });
        callback();
      },
      final: (callback) => {
        send(socket, { t: "in_end", id });
        callback();
      },
    });
  }

  begin(pid: number | null): void {
    this.pid = pid ?? undefined;
    this.run();
  }

  end(end: ProcessEnd): void {
    if (this.over) return;
    this.over = true;
    this.fail(new Error(end.cause ?? "ended before it started"));
    this.stdout.end();
    this.stderr.end();
    // The streams' last lines are read before the end is told.
    setImmediate(() => this.settle(end));
  }

  kill(signal: "SIGTERM" | "SIGKILL"): void {
    if (!this.over) send(this.socket, { t: "kill", id: this.id, signal });
  }
}

/** A server on another node as a ServerChild: ready, its lines, its death or stop relayed. */
class RemoteServer implements ServerChild {
  url = "";
  readonly ready: Promise<ServerChild>;
  private resolveReady!: (server: ServerChild) => void;
  private rejectReady!: (err: Error) => void;
  private readonly deathListeners: ((message: string) => void)[] = [];
  private readonly gone: Promise<void>;
  private markGone!: () => void;
  private stopping = false;
  private over = false;

  constructor(
    private readonly id: number,
    readonly name: string,
    private readonly socket: Socket,
    private readonly onLine?: (line: string) => void,
  ) {
    this.ready = new Promise((resolve, reject) => {
      this.resolveReady = resolve;
      this.rejectReady = reject;
    });
    this.gone = new Promise((resolve) => {
      this.markGone = resolve;
    });
  }

  serving(url: string): void {
    this.url = url;
    this.resolveReady(this);
  }

  line(line: string): void {
    this.onLine?.(line);
  }

  die(message: string): void {
    if (this.over) return;
    this.over = true;
    this.markGone();
    if (!this.url) this.rejectReady(new ServiceError(message));
    else if (!this.stopping) for (const listener of this.deathListeners) listener(message);
  }

  stopped(): void {
    this.over = true;
    this.markGone();
  }

  onDeath(listener: (message: string) => void): void {
    this.deathListeners.push(listener);
  }

  settle(ms: number): Promise<void> {
    return within(this.gone, ms);
  }

  async stop(): Promise<void> {
    this.stopping = true;
    if (this.over) return;
    send(this.socket, { t: "stop_server", id: this.id });
    await this.gone;
  }
}
