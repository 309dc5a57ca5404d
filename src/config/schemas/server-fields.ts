import { z } from "zod";

/** What every `serve-*` command configures about its HTTP side. */
export function listenFields(defaultPort: number) {
  return {
    host: z.string().min(1).default("127.0.0.1").describe("address to bind"),
    port: z
      .number()
      .int()
      .min(0)
      .max(65535)
      .default(defaultPort)
      .describe("TCP port (0 = any free port)"),
  };
}

export function maxBodyField(defaultMb: number) {
  return z
    .number()
    .positive()
    .default(defaultMb)
    .describe("largest request body in MiB (more: 413)");
}
