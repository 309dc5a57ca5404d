import http from "node:http";
import type { AddressInfo } from "node:net";
import type { TextTokenizer } from "../../src/text/tokenizer.js";

/**
 * A stand-in for an SGLang server (and a vLLM one) that replays scripted replies as a real
 * engine returns them: the reply text is encoded with the model's real tokenizer, cut after
 * the first token whose decoded text completes a stop string (SGLang's rule), or at
 * max_new_tokens, and answered with ids, log-probs and finish_reason. It pins the agent
 * loop's exact semantics, which a random tiny model cannot be steered through.
 */

export interface ScriptedReply {
  /** What the "model" writes. */
  text: string;
  /** Append the EOS token after the text (generation then ends there if no stop string came first). */
  eos?: boolean;
}

export interface SeenRequest {
  path: string;
  inputIds: number[];
  /** The context decoded with special tokens. */
  context: string;
  body: Record<string, unknown>;
  at: number;
}

export interface ScriptedEngine {
  url: string;
  requests: SeenRequest[];
  close(): Promise<void>;
}

/** Deterministic stand-in log-probs, so tests can check they are carried through. */
export const fakeLogprob = (id: number, position: number): number => -((id % 13) + position) / 16;

export async function startScriptedEngine(
  tokenizer: TextTokenizer,
  eosId: number,
  /** The reply to a context (decoded with special tokens). */
  script: (context: string, request: SeenRequest) => ScriptedReply | Promise<ScriptedReply>,
  options: { delayMs?: (request: SeenRequest) => number } = {},
): Promise<ScriptedEngine> {
  const requests: SeenRequest[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", async () => {
      const send = (status: number, value: unknown) => {
        res.writeHead(status, { "content-type": "application/json" });
        res.end(JSON.stringify(value));
      };
      if (req.url === "/v1/models") return send(200, { data: [{ id: "scripted" }] });
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}");
      const vllm = req.url === "/v1/completions";
      const inputIds: number[] = vllm ? body.prompt : body.input_ids;
      const params = vllm ? body : body.sampling_params;
      const seen: SeenRequest = {
        path: req.url ?? "",
        inputIds,
        context: await tokenizer.decode(inputIds, false),
        body,
        at: performance.now(),
      };
      requests.push(seen);
      const reply = await script(seen.context, seen);
      const ids = await tokenizer.encode(reply.text, { addSpecialTokens: false });
      if (reply.eos) ids.push(eosId);
      const maxNew: number = vllm ? params.max_tokens : params.max_new_tokens;
      const stops: string[] = params.stop ?? [];
      let out: number[] = [];
      let finish: { type: string; matched?: string | number } = { type: "length" };
      for (const id of ids) {
        if (out.length === maxNew) break;
        out.push(id);
        if (id === eosId) {
          finish = { type: "stop", matched: id };
          break;
        }
        const text = await tokenizer.decode(out, true);
        const hit = stops.find((s) => text.includes(s));
        if (hit) {
          finish = { type: "stop", matched: hit };
          break;
        }
      }
      if (finish.type === "length" && out.length < maxNew) {
        // A script that ends without EOS or stop string: pad as a model rambling on would.
        out = out.concat(Array(maxNew - out.length).fill(ids.at(-1) ?? 0));
      }
      const delay = options.delayMs?.(seen) ?? 0;
      if (delay > 0) await new Promise((r) => setTimeout(r, delay));
      const logprobs = out.map((id, i) => fakeLogprob(id, i));
      if (vllm) {
        return send(200, {
          choices: [
            {
              token_ids: out,
              finish_reason: finish.type,
              stop_reason:
                finish.type === "stop" && typeof finish.matched === "string"
                  ? finish.matched
                  : null,
              logprobs: { token_logprobs: logprobs },
            },
          ],
        });
      }
      send(200, {
        text: await tokenizer.decode(out, true),
        output_ids: out,
        meta_info: {
          prompt_tokens: inputIds.length,
          completion_tokens: out.length,
          cached_tokens: 0,
          finish_reason: finish,
          output_token_logprobs: out.map((id, i) => [logprobs[i], id, null]),
          weight_version: "0",
        },
      });
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
