// A stand-in for the native searchr1-engine that speaks its stdio protocol
// (native/src/engine/PROTOCOL.md) and "samples" a reply chosen in advance: for tests that
// need the model to write something (a tool call) that the tiny random models never write.
// serve-engine runs it in place of the real engine when SEARCHR1_NATIVE_DIR points at a
// folder holding it as `searchr1-engine` (test/engine/openai.test.ts writes that folder).
//
// SCRIPTED_REPLY: the reply's token ids (JSON list); each is sent with log-prob -0.5, the
// last (EOS) ends the sequence with reason stop. SCRIPTED_LOG: a file that gets one JSON
// line per generate command (what the server asked for).
import { appendFileSync } from "node:fs";
import { createInterface } from "node:readline";

const reply = JSON.parse(process.env.SCRIPTED_REPLY ?? "[]");
const log = process.env.SCRIPTED_LOG;
const eos = 450;
const out = (event) => process.stdout.write(`${JSON.stringify(event)}\n`);
const model = process.argv[process.argv.indexOf("--model") + 1];

out({
  ev: "ready",
  model_path: model,
  vocab_size: 451,
  context_length: 8192,
  block_size: 16,
  kv_blocks: 1024,
  eos_token_ids: [eos],
  device: "cpu",
  threads: 1,
  max_running: 256,
  chunk_tokens: 512,
  graphs: false,
  weight_version: "0",
});

createInterface({ input: process.stdin }).on("line", (line) => {
  const cmd = JSON.parse(line);
  if (cmd.op === "generate") {
    if (log) appendFileSync(log, `${line}\n`);
    const ids = reply.slice(0, cmd.max_new_tokens);
    for (const id of ids) out({ ev: "tokens", out: [[cmd.rid, id, -0.5]] });
    const last = ids[ids.length - 1];
    const stopped = last === eos && !cmd.ignore_eos;
    out({
      ev: "done",
      rid: cmd.rid,
      reason: stopped ? "stop" : "length",
      matched: stopped ? eos : null,
      prompt_tokens: cmd.input_ids.length,
      cached_tokens: 0,
      completion_tokens: ids.length,
      weight_version: "0",
    });
  } else if (cmd.op === "stats") {
    out({
      ev: "reply",
      id: cmd.id,
      ok: true,
      running: 0,
      queued: 0,
      kv_blocks_total: 1024,
      kv_blocks_used: 0,
      kv_blocks_cached: 0,
      prefix_hit_tokens: 0,
      prompt_tokens: 0,
      generated_tokens: 0,
      decode_steps: 0,
      kv_full_steps: 0,
      preemptions: 0,
      kv_released: false,
      weight_version: "0",
    });
  } else if (cmd.op === "shutdown") {
    process.exit(0);
  } else if (cmd.id !== undefined) {
    out({ ev: "reply", id: cmd.id, ok: false, message: `the scripted engine has no ${cmd.op}` });
  }
});
process.stdin.on("end", () => process.exit(0));
