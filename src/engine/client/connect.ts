import { type ConfigValues, serverLine } from "../../config/command-line.js";
import { serveEngineSpec } from "../../config/schemas/serve-engine.js";
import { ChildServer, type CommandLine } from "../../runtime/child-server.js";
import { UsageError } from "../../runtime/errors.js";
import { SglangClient } from "./sglang.js";
import type { EngineClient } from "./types.js";
import { VllmClient } from "./vllm.js";

export interface EngineChoice {
  kind: "native" | "sglang" | "vllm";
  /** A running engine; null starts the native one as a child process. */
  url: string | null;
  /** The model the child engine serves. */
  modelPath: string;
  /** More `searchr1 serve-engine` config for the child (e.g. `{ device: "cpu" }`). */
  child?: ConfigValues<typeof serveEngineSpec>;
}

export interface ConnectedEngine {
  client: EngineClient;
  /** The child engine, when this process started one. */
  child: ChildServer | null;
  /** Stops the child engine, if any. */
  stop(): Promise<void>;
}

/** The client for a running engine, or a native engine started for this run. */
export async function connectEngine(
  choice: EngineChoice,
  options: { onLine?: (line: string) => void; signal?: AbortSignal } = {},
): Promise<ConnectedEngine> {
  if (choice.url !== null) {
    const url = choice.url.replace(/\/+$/, "").replace(/\/(generate|v1\/completions)$/, "");
    const client = choice.kind === "vllm" ? new VllmClient(url) : new SglangClient(url);
    return { client, child: null, stop: async () => {} };
  }
  if (choice.kind !== "native") {
    throw new UsageError(
      `rollout.engine is ${choice.kind}: give the running server's address in ` +
        "rollout.engine_url (--engine-url); only the native engine is started here",
    );
  }
  const child = await ChildServer.start("engine", engineChildLine(choice), options);
  return { client: new SglangClient(child.url), child, stop: () => child.stop() };
}

/** The `searchr1 serve-engine` command line of the native engine started for a run. */
export function engineChildLine(choice: Pick<EngineChoice, "modelPath" | "child">): CommandLine {
  return serverLine(serveEngineSpec, { model: choice.modelPath, ...choice.child });
}
