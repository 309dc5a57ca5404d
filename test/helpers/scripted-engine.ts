// A stand-in for an SGLang server (the /generate and /update_weights_from_disk that `train`
// calls with rollout.engine=sglang and rollout.engine_url), for tests that need rewards and
// engine log-probs chosen in advance: the model a test trains is random, so what a real
// engine samples scores 0 everywhere. Each /generate is answered by `respond` from the
// request's context (decoded) and sampling seed; the reply's tokens are that text encoded
// with the model's tokenizer (cut at max_new_tokens), its log-probs `logprob(seed, j)`.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { ModelTokenizer } from "../../src/text/model-tokenizer.js";

export interface ScriptedTurn {
  /** The context of the turn (prompt and turns so far), decoded with special tokens. */
  context: string;
  seed: number;
  maxNewTokens: number;
}

export interface ScriptedEngine {
  url: string;
  /** Every /generate answered, in order: the turn and the text (before the cut). */
  calls: { turn: ScriptedTurn; text: string; tokens: number }[];
  /** How many times new weights were loaded. */
  weightUpdates: number;
  close(): Promise<void>;
}

export async function startScriptedEngine(
  modelDir: string,
  respond: (turn: ScriptedTurn) => string,
  logprob: (seed: number, j: number) => number,
): Promise<ScriptedEngine> {
  const tokenizer = ModelTokenizer.load(modelDir);
  const engine: ScriptedEngine = {
    url: "",
    calls: [],
    weightUpdates: 0,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", async () => {
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}");
      const send = (status: number, value: unknown) => {
        res.writeHead(status, { "Content-Type": "application/json" });
        res.end(JSON.stringify(value));
      };
      if (req.url === "/update_weights_from_disk") {
        engine.weightUpdates++;
        send(200, { success: true, message: "loaded" });
        return;
      }
      if (req.url !== "/generate") {
        send(404, { error: `no ${req.url}` });
        return;
      }
      const params = body.sampling_params ?? {};
      const turn: ScriptedTurn = {
        context: await tokenizer.decode(body.input_ids as number[], false),
        seed: Number(params.sampling_seed ?? 0),
        maxNewTokens: Number(params.max_new_tokens),
      };
      const text = respond(turn);
      const ids = await tokenizer.encode(text, { addSpecialTokens: false });
      const cut = ids.slice(0, turn.maxNewTokens);
      engine.calls.push({ turn, text, tokens: ids.length });
      send(200, {
        output_ids: cut,
        meta_info: {
          finish_reason:
            cut.length < ids.length
              ? { type: "length", matched: null }
              : { type: "stop", matched: "</answer>" },
          output_token_logprobs: cut.map((id, j) => [logprob(turn.seed, j), id, null]),
          weight_version: String(engine.weightUpdates),
        },
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  engine.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return engine;
}
