/** HTTP clients for the test servers (serve-retriever, serve-engine) and their JSON errors. */
import http from "node:http";
import { expect } from "vitest";

export interface Reply {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
  // biome-ignore lint/suspicious/noExplicitAny: test code reads arbitrary JSON answers
  json: any;
}

/**
 * One HTTP request with node:http (full control over the body: a string, raw bytes, or
 * pieces sent chunked without a Content-Length). Resolves with the parsed JSON answer.
 */
export function request(
  base: string,
  method: string,
  path: string,
  body?: string | Buffer | (string | Buffer)[],
  options: { agent?: http.Agent; headers?: http.OutgoingHttpHeaders } = {},
): Promise<Reply> {
  const url = new URL(path, base);
  const headers: http.OutgoingHttpHeaders = { ...options.headers };
  if (body !== undefined && !Array.isArray(body)) {
    headers["Content-Type"] ??= "application/json";
    headers["Content-Length"] = Buffer.byteLength(body);
  }
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, headers, agent: options.agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("error", reject);
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        let json: unknown;
        try {
          json = text ? JSON.parse(text) : undefined;
        } catch {
          json = undefined;
        }
        resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json });
      });
    });
    req.on("error", reject);
    if (Array.isArray(body)) for (const piece of body) req.write(piece);
    else if (body !== undefined) req.write(body);
    req.end();
  });
}

/**
 * The error shape both servers answer (src/runtime/http-server.ts): `status`, a JSON
 * `{"error": message}` whose message contains `mention`. Resolves with the reply.
 */
export async function expectJsonError(
  reply: Promise<Reply>,
  status: number,
  mention: string,
): Promise<Reply> {
  const r = await reply;
  expect(r.status).toBe(status);
  expect(r.headers["content-type"]).toBe("application/json");
  expect(typeof r.json.error).toBe("string");
  expect(r.json.error).toContain(mention);
  return r;
}
