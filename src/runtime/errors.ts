/**
 * Errors the CLI reports as one clean line (no stack trace) with a chosen exit code.
 * Anything else that escapes a command is a bug and is printed with its stack.
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
