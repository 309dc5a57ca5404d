import { CommanderError } from "commander";
import { CliError, describeSystemError } from "../src/runtime/errors.js";
import { buildProgram } from "./program.js";

/**
 * A reader that stops early (`searchr1 config train | head`) closes stdout: that ends the
 * output, quietly, as for any Unix tool; it is not an error.
 */
function endQuietlyOnClosedStdout(): void {
  process.stdout.on("error", (err: NodeJS.ErrnoException) => {
    if (err.code === "EPIPE") process.exit(process.exitCode ?? 0);
    throw err;
  });
}

/** Runs the CLI: clean one-line errors with their exit code; anything unexpected is a bug. */
export async function main(argv: string[]): Promise<number> {
  try {
    await buildProgram().parseAsync(argv);
    return 0;
  } catch (err) {
    if (err instanceof CommanderError) {
      // Commander has already printed help or its usage error; usage errors exit 2.
      return err.exitCode === 0 ? 0 : 2;
    }
    if (err instanceof CliError) {
      for (const line of err.message.split("\n"))
        process.stderr.write(`searchr1: error: ${line}\n`);
      return err.exitCode;
    }
    const system = describeSystemError(err);
    if (system) {
      process.stderr.write(`searchr1: error: ${system}\n`);
      return 1;
    }
    process.stderr.write(`searchr1: internal error: ${(err as Error)?.stack ?? String(err)}\n`);
    return 1;
  }
}

endQuietlyOnClosedStdout();
process.exitCode = await main(process.argv);
