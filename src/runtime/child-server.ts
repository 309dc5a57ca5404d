import { join } from "node:path";
import { createInterface } from "node:readline";
import { execa, type ResultPromise } from "execa";
import { ServiceError } from "./errors.js";
import { packageRoot } from "./package-root.js";

/**
 * `searchr1 <command> <args>`, as src/config/command-line.ts builds it from config values
 * typed by the command's schema (never by hand, so a renamed key fails where it is built).
 */
export interface CommandLine {
  readonly command: string;
  readonly args: readonly string[];
  /**
   * Variables added to the child's environment (the rest is inherited): `train --gpus N`
   * gives each engine replica its one device as `CUDA_VISIBLE_DEVICES`.
   */
  readonly env?: Readonly<Record<string, string>>;
}

/** The arguments of `node` that run a command line with this package's CLI. */
export function searchr1Argv(line: CommandLine): string[] {
  return [join(packageRoot(), "bin", "searchr1"), line.command, ...line.args];
}

/**
 * A server a run started and stops: a ChildServer here, or one a node of a multi-node run
 * started for it (src/nodes).
 */
export interface ServerChild {
  readonly url: string;
  /** Called with a one-line-plus-stderr message if it dies before `stop()`. */
  onDeath(listener: (message: string) => void): void;
  /** Resolves once it has exited (its death already told to listeners), or after `ms`. */
  settle(ms: number): Promise<void>;
  /** Asks it to drain and exit, then waits for it. */
  stop(): Promise<void>;
}

/** Starts a server from its command line, ready once it serves. */
export type StartServer = (
  name: string,
  line: CommandLine,
  options?: { onLine?: (line: string) => void; signal?: AbortSignal },
) => Promise<ServerChild>;

/**
 * A `searchr1 serve-*` command run as a child process (`eval` and `train` start the engine
 * and the retriever this way when no URL is given). Its command line (config/command-line.ts's
 * serverLine) has it listen on a free port; it is ready when it prints its `serving ... at
 * <url>` line; its stderr is kept (the last lines) so a child that dies is reported with what
 * it said.
 */
export class ChildServer implements ServerChild {
  private readonly tail: string[] = [];
  private exited = false;
  private stopping = false;
  private deathListeners: ((message: string) => void)[] = [];

  private constructor(
    /** What the user calls it in messages: "engine", "retriever". */
    readonly name: string,
    private readonly child: ResultPromise,
    readonly url: string,
  ) {}

  /**
   * Runs `searchr1 <command> <args>` and resolves once it serves. Rejects with a CliError
   * carrying its last stderr lines when it exits first.
   */
  static async start(
    name: string,
    line: CommandLine,
    options: { onLine?: (line: string) => void; signal?: AbortSignal } = {},
  ): Promise<ChildServer> {
    const { command } = line;
    const child = execa(process.execPath, searchr1Argv(line), {
      stdin: "ignore",
      stdout: "ignore",
      stderr: "pipe",
      env: line.env,
      reject: false,
      cancelSignal: options.signal,
      forceKillAfterDelay: 10_000,
    });
    const tail: string[] = [];
    let server: ChildServer | null = null;
    const url = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child.stderr as NodeJS.ReadableStream }).on("line", (text) => {
        const kept = server?.tail ?? tail;
        kept.push(text);
        if (kept.length > 20) kept.shift();
        options.onLine?.(text);
        const ready = /^serving .* at (https?:\/\/\S+) /.exec(text);
        if (ready && !server) resolve(ready[1] as string);
      });
      void child.then((result) => {
        if (!server) {
          reject(
            new ServiceError(
              `the ${name} (searchr1 ${command}) exited before it was ready ` +
                `(${result.exitCode ?? result.signal})${lastLines(tail)}`,
            ),
          );
        }
      });
    });
    server = new ChildServer(name, child, url);
    server.tail.push(...tail);
    void child.then((result) => {
      server.exited = true;
      if (server.stopping) return;
      const message =
        `the ${name} (searchr1 ${command}) died (${result.exitCode ?? result.signal})` +
        lastLines(server.tail);
      for (const listener of server.deathListeners) listener(message);
    });
    return server;
  }

  /** Called with a one-line-plus-stderr message if the child dies before `stop()`. */
  onDeath(listener: (message: string) => void): void {
    this.deathListeners.push(listener);
  }

  /** Resolves once the child has exited (its death already told to listeners), or after `ms`. */
  settle(ms: number): Promise<void> {
    return within(this.child, ms);
  }

  /** SIGTERM (the server drains and exits), then waits for it. */
  async stop(): Promise<void> {
    this.stopping = true;
    if (this.exited) return;
    this.child.kill("SIGTERM");
    await this.child;
  }
}

/** Resolves once `done` settles, or after `ms`, whichever is first. */
export async function within(done: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    done.then(
      () => {},
      () => {},
    ),
    new Promise<void>((resolve) => {
      timer = setTimeout(resolve, ms);
    }),
  ]);
  clearTimeout(timer);
}

function lastLines(lines: readonly string[]): string {
  const shown = lines.filter((l) => l.trim() !== "").slice(-8);
  return shown.length ? `; its last lines:\n  ${shown.join("\n  ")}` : "";
}
