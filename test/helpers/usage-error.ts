// The message of the UsageError `fn` throws (a config or command-line refusal), or of the
// HttpError 400 (a request refused); fails the test when it throws nothing or something else.
import { expect } from "vitest";
import { UsageError } from "../../src/runtime/errors.js";
import { HttpError } from "../../src/runtime/http-server.js";

export function usageErrorOf(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(UsageError);
    return (err as Error).message;
  }
  throw new Error("expected a UsageError");
}

/** The message of the HttpError 400 `fn` throws (a request refused); fails the test otherwise. */
export function badRequestOf(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(HttpError);
    expect((err as HttpError).status).toBe(400);
    return (err as Error).message;
  }
  throw new Error("expected an HttpError 400");
}
