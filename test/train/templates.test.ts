import { readdirSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { expect, it } from "vitest";
import { parse } from "yaml";
import { loadToolConfig, SEARCH_TOOL } from "../../src/agent/tool-config.js";
import { runCli } from "../helpers/cli.js";

const DIR = fileURLToPath(new URL("../../templates/configs/", import.meta.url));
const resolved = (file: string) => {
  const r = runCli(["config", "train", "--config", path.join(DIR, file)]);
  expect(r.code, `${file}: ${r.stderr}`).toBe(0);
  return parse(r.stdout);
};

it("every recipe in templates/configs resolves with `searchr1 config train`", () => {
  const files = readdirSync(DIR).filter((f) => f.endsWith(".yaml"));
  expect(files.length).toBeGreaterThanOrEqual(6);
  for (const f of files) resolved(f);
});

it("the recipes carry their published hyper-parameters", () => {
  const ppo = resolved("search-r1-v0.2-ppo.yaml");
  expect(ppo.algorithm).toMatchObject({ name: "ppo", use_kl_in_reward: true, kl_coef: 0.001 });
  expect(ppo.critic).toMatchObject({ lr: 1e-5, lr_warmup_steps_ratio: 0.015 });
  expect(ppo.rollout).toMatchObject({ n: 1, max_turns: 4, top_p: 1 });
  const grpo = resolved("search-r1-v0.2-grpo.yaml");
  expect(grpo.actor).toMatchObject({
    use_kl_loss: true,
    kl_loss_type: "low_var_kl",
    kl_loss_coef: 0.001,
  });
  // Search-R1 repeats each prompt 5 times (n_agent); verl's n stays 1, so the mini-batch of
  // 256 counts trajectories: 10 optimizer steps a step.
  expect(grpo.rollout).toMatchObject({ n: 1, n_agent: 5, top_p: 0.95 });
  // Search-R1's scripts and verl's recipe keep the reference's parameters on the CPU.
  for (const recipe of [ppo, grpo, resolved("verl-sglang-search-r1-qwen2.5-3b-grpo.yaml")]) {
    expect(recipe.ref.param_offload).toBe(true);
  }
  expect(resolved("search-r1-v0.3-grpo-format.yaml")).toMatchObject({
    actor: { lr: 5e-7 },
    reward: { format_reward: true, structure_format_score: 0.2, final_format_score: 0.1 },
  });
  const skyrl = resolved("skyrl-search-r1-qwen2.5-3b-grpo.yaml");
  expect(skyrl.actor).toMatchObject({ grad_clip: 0.5 });
  expect(skyrl.algorithm.rollout_correction).toMatchObject({
    rollout_is: "token",
    rollout_is_threshold: 2,
  });
  const dapo = resolved("dapo-search-r1-grpo.yaml");
  expect(dapo.algorithm.filter_groups).toEqual({
    enable: true,
    metric: "acc",
    max_num_gen_batches: 10,
  });
  expect(dapo.actor).toMatchObject({
    use_kl_loss: false,
    clip_ratio_low: 0.2,
    clip_ratio_high: 0.28,
    loss_agg_mode: "token-mean",
  });
  expect(dapo.reward.overlong_buffer).toEqual({ enable: true, len: 100, penalty_factor: 1 });
  expect(dapo.rollout).toMatchObject({ n: 1, n_agent: 5, top_p: 1 });
  const verl = resolved("verl-sglang-search-r1-qwen2.5-3b-grpo.yaml");
  // verl's search_r1_like recipe as verl runs it: Hermes tool calls, its tool_config,
  // max_assistant_turns 2, a 3000-token response across turns (verl's max_prompt_length
  // 4096 is the prompt's budget here, the context 4096 + 3000).
  expect(verl.rollout).toMatchObject({
    engine: "sglang",
    multi_turn: {
      format: "hermes",
      tool_config_path: "templates/tools/search_tool_config.yaml",
      max_assistant_turns: 2,
      max_parallel_calls: 1,
      max_tool_response_length: 256,
    },
  });
  expect(verl.data).toMatchObject({
    max_start_length: 4096,
    max_prompt_length: 7096,
    max_response_length: 3000,
  });
  expect(verl.reward).toMatchObject({ format_reward: false, search_r1_extract: false });
});

it("the shipped verl tool_config gives the model verl's search tool schema", () => {
  expect(loadToolConfig(path.join(DIR, "../tools/search_tool_config.yaml"))).toEqual([SEARCH_TOOL]);
});
