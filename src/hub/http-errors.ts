import { CliError } from "../runtime/errors.js";
import { describeRepo, type RepoRef } from "./repo.js";

/** A hub or storage answer that is not the one asked for. */
export class HubStatusError extends Error {
  constructor(
    readonly status: number,
    readonly url: string,
    /** The hub's machine-readable reason (X-Error-Code), e.g. GatedRepo, EntryNotFound. */
    readonly errorCode: string | undefined,
    readonly serverMessage: string | undefined,
  ) {
    super(`HTTP ${status} from ${url}${serverMessage ? `: ${serverMessage}` : ""}`);
    this.name = "HubStatusError";
  }
}

/** The bytes received do not hash to what the hub published. */
export class IntegrityError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "IntegrityError";
  }
}

const RETRYABLE_CODES = new Set([
  "ECONNRESET",
  "ECONNREFUSED",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "EAI_AGAIN",
  "ENETUNREACH",
  "EHOSTUNREACH",
  "ERR_STREAM_PREMATURE_CLOSE",
  "ERR_GOT_REQUEST_ERROR",
  "ERR_BODY_SHORT",
  "ERR_LOCATION_EXPIRED",
]);

/** Server trouble and broken connections are worth another try; refusals (4xx) are not. */
export function isRetryable(err: unknown): boolean {
  if (err instanceof HubStatusError) {
    return err.status >= 500 || err.status === 429 || err.status === 408;
  }
  if (err instanceof IntegrityError) return false;
  const e = err as { code?: string; name?: string } | undefined;
  if (!e) return false;
  if (e.name === "TimeoutError" || e.name === "ReadError") return true;
  return e.code !== undefined && RETRYABLE_CODES.has(e.code);
}

export interface ErrorContext {
  repo: RepoRef;
  /** The file, when the failure is about one. */
  path?: string;
  hasToken: boolean;
}

/** A hub refusal or transfer failure: exit 1, like other failures of the data itself. */
function failure(message: string): CliError {
  return new CliError(message, 1);
}

/** Turns a refusal from the hub into a message that says what to do about it. */
export function explainHubError(err: unknown, ctx: ErrorContext): Error {
  if (!(err instanceof HubStatusError)) return err as Error;
  const repo = describeRepo(ctx.repo);
  const what = ctx.path ? `${ctx.path} in ${repo}` : repo;
  const gated =
    err.errorCode === "GatedRepo" || (err.status === 403 && err.errorCode !== "RepoNotFound");
  if (gated) {
    return failure(
      `${what}: access denied (HTTP ${err.status}); ${ctx.repo.id} is gated or private: accept its terms on the hub and ${
        ctx.hasToken
          ? "check that HF_TOKEN / --token belongs to an account with access"
          : "set HF_TOKEN (or --token) to an access token"
      }`,
    );
  }
  if (err.errorCode === "RepoNotFound" || (err.status === 401 && !err.errorCode)) {
    return failure(
      `${repo}: repository not found (HTTP ${err.status}); check the name and --repo-type${
        ctx.hasToken ? "" : ", or set HF_TOKEN if it is private"
      }`,
    );
  }
  if (err.errorCode === "RevisionNotFound") {
    return failure(`${repo}: revision "${ctx.repo.revision}" does not exist (--revision)`);
  }
  if (err.status === 404) {
    return failure(
      ctx.path
        ? `${ctx.path}: no such file in ${ctx.repo.type} ${ctx.repo.id} at revision ${ctx.repo.revision} (HTTP 404)`
        : `${repo}: not found (HTTP 404)`,
    );
  }
  return failure(`${what}: ${err.message}`);
}
