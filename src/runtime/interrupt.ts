import { CliError } from "./errors.js";

/**
 * Runs work that honours an AbortSignal, aborting it on the first Ctrl-C / SIGTERM so it
 * can remove its temporary files; exits 130 after it has cleaned up.
 */
export async function withInterrupt<T>(
  work: (signal: AbortSignal) => Promise<T>,
  /** What the user is told was left behind. */
  message = "interrupted; nothing was written",
): Promise<T> {
  const controller = new AbortController();
  const onSignal = () => controller.abort();
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    return await work(controller.signal);
  } catch (err) {
    if (controller.signal.aborted) throw new CliError(message, 130);
    throw err;
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}
