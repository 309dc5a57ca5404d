/**
 * Errors in OpenAI's shape, which the `openai` clients read into their exception classes
 * (BadRequestError for 400, AuthenticationError for 401, NotFoundError for 404, ...):
 * `{"error": {"message", "type", "param", "code"}}` (openai-python's `APIError` reads
 * these four; vLLM's `ErrorResponse`, vllm/entrypoints/openai/engine/protocol.py, has the
 * same keys). `type` is OpenAI's own: `invalid_request_error` for a 4xx, `server_error`
 * for a 5xx.
 */
import { HttpError } from "../../runtime/http-server.js";

/** An HttpError with OpenAI's `param` (the request field at fault) and `code`. */
export class OpenAIError extends HttpError {
  constructor(
    status: number,
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
    headers: Record<string, string> = {},
  ) {
    super(status, message, headers);
  }
}

export interface OpenAIErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

/**
 * The body for an error answered with `status`. `param` is the OpenAIError's, else the
 * field the message starts with: the request checks (../generate-request.ts and
 * ./request.ts) begin their messages with the quoted field, e.g. `"top_p" must be ...`.
 */
export function openAIErrorBody(status: number, message: string, err: unknown): OpenAIErrorBody {
  let param: string | null = null;
  let code: string | null = null;
  if (err instanceof OpenAIError) {
    param = err.param;
    code = err.code;
  } else {
    param = /^"([^"\s]+)"/.exec(message)?.[1] ?? null;
  }
  const type = status >= 500 ? "server_error" : "invalid_request_error";
  return { error: { message, type, param, code } };
}
