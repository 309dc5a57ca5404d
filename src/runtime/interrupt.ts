import { CliError } from "./errors.js";

/**
 * Runs work that honours an AbortSignal, aborting it on the first Ctrl-C / SIGTERM so it
 * can remove its temporary files and stop its children; exits 130 after it has cleaned up.
 * A second signal exits at once.
 *
 * The handler stays installed (`on`, not `once`) while the work runs: execa's exit hook
 * (signal-exit) re-raises a signal that no other listener handles, and a `once` listener is
 * already gone when that hook looks, which killed the process before it could clean up.
 */
export async function withInterrupt<T>(
  work: (signal: AbortSignal) => Promise<T>,
  /** What the user is told was left behind. */
  message = "interrupted; nothing was written",
): Promise<T> {
  const controller = new AbortController();
  const onSignal = () => {
    if (controller.signal.aborted) process.exit(130);
    controller.abort();
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
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
