/**
 * A native `serve` process (searchr1-trainer serve, searchr1-index serve) driven line by
 * line as a test needs it: JSON commands on stdin, one reply line each on stdout, stderr
 * collected. Processes still running when the test file ends are killed.
 */
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { afterAll, expect } from "vitest";

export type Reply = Record<string, unknown> & { id: unknown; ok: boolean; error?: string };

const running: ChildProcessWithoutNullStreams[] = [];
afterAll(() => {
  for (const p of running) if (p.exitCode === null && p.signalCode === null) p.kill();
});

export class ServeProcess {
  readonly proc: ChildProcessWithoutNullStreams;
  readonly exit: Promise<number | null>;
  stderr = "";
  private readonly lines: string[] = [];
  private readonly waiting: { resolve: (line: string) => void; reject: (e: Error) => void }[] = [];
  private nextId = 1;
  private gone = false;

  constructor(executable: string, args: string[], env: NodeJS.ProcessEnv) {
    this.proc = spawn(executable, args, { env });
    running.push(this.proc);
    this.proc.stderr.setEncoding("utf8").on("data", (d: string) => {
      this.stderr += d;
    });
    createInterface({ input: this.proc.stdout }).on("line", (line) => {
      const w = this.waiting.shift();
      if (w) w.resolve(line);
      else this.lines.push(line);
    });
    this.exit = new Promise((resolve) => {
      this.proc.on("close", (code) => {
        this.gone = true;
        for (const w of this.waiting.splice(0)) {
          w.reject(new Error(`serve exited ${code} before replying: ${this.stderr}`));
        }
        resolve(code);
      });
    });
  }

  /** Writes one line and returns the reply line. */
  line(text: string): Promise<string> {
    const ready = this.lines.shift();
    if (ready !== undefined) return Promise.resolve(ready);
    if (this.gone) return Promise.reject(new Error(`serve has exited: ${this.stderr}`));
    return new Promise((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      this.proc.stdin.write(`${text}\n`);
    });
  }

  /** Sends a command with a fresh id and checks that the reply echoes it. */
  async send(op: string, fields: Record<string, unknown> = {}): Promise<Reply> {
    const id = this.nextId++;
    const reply = JSON.parse(await this.line(JSON.stringify({ op, id, ...fields }))) as Reply;
    expect(reply.id).toBe(id);
    return reply;
  }

  /** Sends a command that must succeed; returns the reply without ok and id. */
  async ok(op: string, fields: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
    const { ok, id: _id, ...rest } = await this.send(op, fields);
    if (!ok) throw new Error(`${op} failed: ${rest.error}`);
    return rest;
  }

  /** Sends a command that must fail; returns its error message. */
  async fails(op: string, fields: Record<string, unknown> = {}): Promise<string> {
    const r = await this.send(op, fields);
    expect(r.ok, `${op} ${JSON.stringify(fields)} should fail`).toBe(false);
    expect(typeof r.error).toBe("string");
    return r.error ?? "";
  }

  /** Closes stdin and returns the exit code. */
  close(): Promise<number | null> {
    this.proc.stdin.end();
    return this.exit;
  }
}
