/**
 * serve-engine's `--api-key`, as vLLM's: a request must carry `Authorization: Bearer <key>`
 * (vllm/entrypoints/openai/api_server.py checks the same header), else it is answered 401
 * in OpenAI's error shape (code `invalid_api_key`, as OpenAI answers a bad key), which the
 * `openai` clients raise as AuthenticationError. The comparison takes the same time
 * whatever the key sent: both sides are hashed to SHA-256 digests of one length and compared
 * with crypto.timingSafeEqual. The key itself is kept only as its digest and never written
 * anywhere.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import type { IncomingMessage } from "node:http";
import { OpenAIError } from "./openai/errors.js";

function digest(text: string): Buffer {
  return createHash("sha256").update(text, "utf8").digest();
}

export class ApiKey {
  private readonly digest: Buffer;

  constructor(key: string) {
    this.digest = digest(key);
  }

  /** True when `header` is `Bearer <the key>` (the scheme in any case, as RFC 7235 has it). */
  matches(header: string | undefined): boolean {
    const m = /^bearer +(.*)$/i.exec(header ?? "");
    // A missing header is compared too, so that every refusal takes the same path.
    return timingSafeEqual(digest(m ? (m[1] as string) : ""), this.digest) && m !== null;
  }

  /** Throws the 401 unless the request carries the key. */
  check(req: IncomingMessage): void {
    if (this.matches(req.headers.authorization)) return;
    const sent =
      req.headers.authorization === undefined ? "no Authorization header" : "a wrong key";
    throw new OpenAIError(
      401,
      `${sent}: this server needs "Authorization: Bearer <key>" with the key it was started ` +
        "with (--api-key or SEARCHR1_API_KEY)",
      null,
      "invalid_api_key",
      { "WWW-Authenticate": "Bearer" },
    );
  }
}
