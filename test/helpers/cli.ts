import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

export const BIN = fileURLToPath(new URL("../../bin/searchr1", import.meta.url));

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the built CLI (bin/searchr1 → dist/) as a user would, without a terminal. */
export function runCli(
  args: string[],
  options: { cwd?: string; env?: Record<string, string> } = {},
): CliResult {
  const r = spawnSync(process.execPath, [BIN, ...args], {
    cwd: options.cwd,
    env: { ...process.env, ...options.env },
    encoding: "utf8",
    timeout: 60_000,
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

export interface RunningCli {
  child: ChildProcess;
  /** Output so far, as it arrives. */
  output: { stdout: string; stderr: string };
  result: Promise<CliResult>;
}

/**
 * Starts the CLI without blocking this process, for tests whose servers run in the test
 * process itself (spawnSync would freeze them) or that signal the CLI mid-run.
 */
export function startCli(
  args: string[],
  options: { cwd?: string; env?: Record<string, string> } = {},
): RunningCli {
  const child = spawn(process.execPath, [BIN, ...args], {
    cwd: options.cwd,
    env: { ...process.env, ...options.env },
  });
  const output = { stdout: "", stderr: "" };
  child.stdout.setEncoding("utf8").on("data", (d: string) => {
    output.stdout += d;
  });
  child.stderr.setEncoding("utf8").on("data", (d: string) => {
    output.stderr += d;
  });
  const result = new Promise<CliResult>((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, ...output }));
  });
  return { child, output, result };
}

export interface ServingCli {
  /** The URL the server printed (the first group of `serving`). */
  url: string;
  cli: RunningCli;
  /** SIGTERM, then the exit code and output. */
  stop(): Promise<CliResult>;
}

/**
 * Starts a serving command (`args[0]`, e.g. serve-retriever) as a child process and resolves
 * once its stderr matches `serving`, whose first group is the URL it serves at; rejects with
 * its output if it exits first or does not start in `timeoutMs`.
 */
export function startServing(
  args: string[],
  serving: RegExp,
  options: { env?: Record<string, string>; timeoutMs: number },
): Promise<ServingCli> {
  const name = args[0];
  const cli = startCli(args, { env: options.env });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      cli.child.kill("SIGKILL");
      reject(new Error(`${name} did not start in ${options.timeoutMs} ms: ${cli.output.stderr}`));
    }, options.timeoutMs);
    const onData = () => {
      const m = serving.exec(cli.output.stderr);
      if (!m) return;
      clearTimeout(timer);
      cli.child.stderr?.off("data", onData);
      resolve({
        url: m[1] as string,
        cli,
        stop: () => {
          if (cli.child.exitCode === null) cli.child.kill("SIGTERM");
          return cli.result;
        },
      });
    };
    cli.child.stderr?.on("data", onData);
    cli.result.then(
      (r) => {
        clearTimeout(timer);
        reject(new Error(`${name} exited (${r.code}) before serving: ${r.stderr}`));
      },
      (err) => {
        clearTimeout(timer);
        reject(err);
      },
    );
  });
}
