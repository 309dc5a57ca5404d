import { CliError } from "../runtime/errors.js";
import { HttpStatusError } from "../runtime/http-client.js";
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
  if (err instanceof HubStatusError || err instanceof HttpStatusError) {
    return err.status >= 500 || err.status === 429 || err.status === 408;
  }
  if (err instanceof IntegrityError) return false;
  const e = err as { code?: string; name?: string } | undefined;
  if (!e) return false;
  if (e.name === "TimeoutError" || e.name === "ReadError") return true;
  return e.code !== undefined && RETRYABLE_CODES.has(e.code);
}

/**
 * A request that got no HTTP answer at all: the host could not be reached (refused, no
 * such name, no route, no connection in time) or not trusted (TLS).
 */
export interface TransportFailure {
  /** The URL asked for, when the error carries it (got's errors do). */
  url: URL | undefined;
  code: string;
  /** What happened, for a person: "connection refused", "host name not found (DNS)". */
  reason: string;
  /** The connection was never made: nothing was said by the host. */
  unreachable: boolean;
  tls: boolean;
}

const UNREACHABLE: Record<string, string> = {
  ECONNREFUSED: "connection refused",
  ENOTFOUND: "host name not found (DNS)",
  EAI_AGAIN: "DNS lookup failed (temporary)",
  EAI_FAIL: "DNS lookup failed",
  ENETUNREACH: "network unreachable",
  EHOSTUNREACH: "no route to host",
  EHOSTDOWN: "host is down",
  EADDRNOTAVAIL: "address not available",
};

const TLS_CODE =
  /^(EPROTO|ERR_SSL_\w+|ERR_TLS_\w+|CERT_\w+|UNABLE_TO_\w+|DEPTH_ZERO_SELF_SIGNED_CERT|SELF_SIGNED_CERT_IN_CHAIN|HOSTNAME_MISMATCH|ERR_OSSL_\w+)$/;

/** The short reason OpenSSL gives inside a long message ("...:SSL routines:fn:wrong version number:..."). */
function tlsReason(message: string): string | undefined {
  return /SSL routines:[^:]*:([^:]+)/.exec(message)?.[1]?.trim();
}

/** Phases of got's timeouts that come before the host has answered anything. */
const CONNECT_PHASES = new Set(["lookup", "connect", "secureConnect"]);

/** Classifies an error that is not an HTTP answer; undefined for everything else. */
export function transportFailure(err: unknown): TransportFailure | undefined {
  if (err instanceof HubStatusError || err instanceof IntegrityError || err instanceof CliError)
    return undefined;
  const e = err as
    | {
        code?: unknown;
        name?: string;
        message?: string;
        event?: string;
        options?: { url?: unknown };
      }
    | undefined;
  if (!e || typeof e.code !== "string") return undefined;
  const url = e.options?.url instanceof URL ? e.options.url : undefined;
  const code = e.code;
  const base = { url, code };
  if (UNREACHABLE[code])
    return { ...base, reason: UNREACHABLE[code], unreachable: true, tls: false };
  if (TLS_CODE.test(code)) {
    const detail = tlsReason(e.message ?? "") ?? e.message?.split("\n")[0] ?? code;
    return { ...base, reason: `TLS error: ${detail}`, unreachable: true, tls: true };
  }
  if (e.name === "TimeoutError") {
    const connecting = CONNECT_PHASES.has(e.event ?? "");
    return {
      ...base,
      reason: connecting ? "no connection within the timeout" : "no answer within the timeout",
      unreachable: connecting,
      tls: false,
    };
  }
  if (code === "ECONNRESET" || code === "EPIPE" || code === "ECONNABORTED")
    return { ...base, reason: "connection dropped", unreachable: false, tls: false };
  return undefined;
}

function proxyNote(): string {
  const env = process.env;
  const set = ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
    .filter((name) => env[name])
    .map((name) => name.toUpperCase())[0];
  return set ? ` (${set} is set, but searchr1 connects directly, not through a proxy)` : "";
}

function sameOrigin(url: URL | undefined, endpoint: string | undefined): boolean {
  if (!url || !endpoint) return true;
  try {
    return url.origin === new URL(endpoint).origin;
  } catch {
    return true;
  }
}

/** "hub" or "storage host cdn.example" for the host behind a failed request. */
function whichHost(f: TransportFailure, endpoint: string | undefined): string {
  return sameOrigin(f.url, endpoint) ? "hub" : `storage host ${f.url?.host}`;
}

function formatWait(ms: number): string {
  const s = ms / 1000;
  return s >= 10 ? `${Math.round(s)} s` : s >= 1 ? `${s.toFixed(1)} s` : `${s.toFixed(2)} s`;
}

export interface RetryNoticeContext {
  /** What was being fetched: a file path or "file list of <repo>". */
  label: string;
  endpoint: string;
  retries: number;
}

/**
 * The line announcing a retry as it is scheduled, so a long wait is never silent:
 * "hub unreachable (connection refused, 127.0.0.1:9), retry 2/8 in 4.0 s".
 */
export function retryNotice(
  err: unknown,
  n: number,
  waitMs: number,
  ctx: RetryNoticeContext,
): string {
  const when = `retry ${n}/${ctx.retries} in ${formatWait(waitMs)}`;
  const f = transportFailure(err);
  if (f?.unreachable) {
    const host = f.url?.host ?? new URL(ctx.endpoint).host;
    return `${whichHost(f, ctx.endpoint)} unreachable (${f.reason}, ${host}), ${when}`;
  }
  const message = f ? `${f.reason} (${f.url?.host ?? ctx.endpoint})` : (err as Error).message;
  return `${ctx.label}: ${message}; ${when}`;
}

/**
 * The one-line error for a host that could not be reached or trusted: names the endpoint
 * (or the storage host it redirected to) and what to check.
 */
export function explainTransport(
  f: TransportFailure,
  endpoint: string | undefined,
  what: string,
): string {
  const origin = f.url?.origin ?? endpoint ?? "the hub";
  const hub = sameOrigin(f.url, endpoint);
  const where = hub
    ? `the hub at ${origin}`
    : `${origin} (where the hub at ${endpoint} sent ${what})`;
  const code = f.reason.includes(f.code) ? "" : ` (${f.code})`;
  if (f.tls) {
    return `cannot talk to ${where}: ${f.reason}${code}; check HF_ENDPOINT (https:// for a TLS server, http:// for a plain one) and, behind a proxy that re-signs TLS, point NODE_EXTRA_CA_CERTS at its CA certificate${proxyNote()}`;
  }
  if (f.unreachable) {
    const check = hub ? "HF_ENDPOINT (the hub URL)" : "that this host is reachable";
    return `cannot reach ${where}: ${f.reason}${code}; check ${check}, the network connection, and any proxy or firewall in between${proxyNote()}`;
  }
  return `${what}: ${f.reason} from ${origin}${code}; run the same command again to resume, or raise timeout_s / retries`;
}

export interface ErrorContext {
  repo: RepoRef;
  /** The file, when the failure is about one. */
  path?: string;
  hasToken: boolean;
  /** The hub URL in use (HF_ENDPOINT), named when it cannot be reached. */
  endpoint?: string;
}

/** A hub refusal or transfer failure: exit 1, like other failures of the data itself. */
function failure(message: string): CliError {
  return new CliError(message, 1);
}

/** Turns a refusal from the hub into a message that says what to do about it. */
export function explainHubError(err: unknown, ctx: ErrorContext): Error {
  const repo = describeRepo(ctx.repo);
  const what = ctx.path ? `${ctx.path} in ${repo}` : repo;
  const transport = transportFailure(err);
  if (transport) return failure(explainTransport(transport, ctx.endpoint, what));
  if (!(err instanceof HubStatusError)) return err as Error;
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
