import { statSync } from "node:fs";

/**
 * Errors the CLI reports as one clean line (no stack trace) with a chosen exit code.
 * Anything else that escapes a command is a bug and is printed with its stack, except the
 * operating system's refusals (see {@link describeSystemError}), which are foreseeable.
 */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode: number,
  ) {
    super(message);
    this.name = new.target.name;
  }
}

/** Bad input data or files: names the file (and line) and what was expected. Exit 1. */
export class InputError extends CliError {
  constructor(message: string) {
    super(message, 1);
  }
}

/** A server the command depends on (engine, retriever, trainer) failed or refused: names it. Exit 1. */
export class ServiceError extends CliError {
  constructor(message: string) {
    super(message, 1);
  }
}

/** Bad options or configuration: names the key, where it came from and what was expected. Exit 2. */
export class UsageError extends CliError {
  constructor(message: string) {
    super(message, 2);
  }
}

/** A command whose capability has not landed yet. Exit 2, never invented output. */
export class NotImplementedError extends CliError {
  constructor(command: string) {
    super(`${command}: not implemented yet`, 2);
  }
}

/** What the operating system's refusals mean, for the ones a command can meet in normal use. */
const SYSTEM_ERRORS: Record<string, string> = {
  EACCES: "permission denied",
  EPERM: "operation not permitted",
  ENOSPC: "no space left on the device",
  EDQUOT: "disk quota exceeded",
  EROFS: "read-only file system",
  ENOENT: "no such file or folder",
  ENOTDIR: "a part of the path is a file, not a folder",
  EISDIR: "is a folder, not a file",
  EEXIST: "already exists",
  ENOTEMPTY: "folder not empty",
  EMFILE: "too many open files (raise the limit with ulimit -n)",
  ENFILE: "too many open files on the system",
  ENAMETOOLONG: "name too long",
  ELOOP: "too many levels of symbolic links",
  EBUSY: "busy",
  EIO: "input/output error",
  EXDEV: "cannot move across file systems",
};

/**
 * The one line for an operating-system refusal (a file that cannot be written, a full
 * disk, ...), naming the path and what was tried; undefined for any other error.
 */
export function describeSystemError(err: unknown): string | undefined {
  const e = err as { code?: unknown; syscall?: unknown; path?: unknown; dest?: unknown };
  if (typeof e?.code !== "string" || typeof e.syscall !== "string") return undefined;
  const fileInTheWay =
    e.code === "EEXIST" &&
    e.syscall === "mkdir" &&
    typeof e.path === "string" &&
    statSync(e.path, { throwIfNoEntry: false })?.isDirectory() === false;
  const meaning = fileInTheWay ? "is a file, where a folder is needed" : SYSTEM_ERRORS[e.code];
  if (!meaning) return undefined;
  const where = typeof e.path === "string" ? e.path : undefined;
  const to = typeof e.dest === "string" ? ` -> ${e.dest}` : "";
  return `${where ? `${where}${to}: ` : ""}${meaning} (${e.syscall}, ${e.code})`;
}
