// The message of the UsageError `fn` throws (a config or command-line refusal); fails the
// test when it throws nothing or something else.
import { expect } from "vitest";
import { UsageError } from "../../src/runtime/errors.js";

export function usageErrorOf(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(UsageError);
    return (err as Error).message;
  }
  throw new Error("expected a UsageError");
}
