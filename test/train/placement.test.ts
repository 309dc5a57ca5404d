// Where `train --gpus N` puts its trainer ranks and engine replicas (src/train/placement.ts):
// rank r and replica r on device r, each seeing only it, or all on the CPU. The GPU probe is
// injected here; the real one (`searchr1-trainer info` seeing one device) runs at the end.
import { describe, expect, it } from "vitest";
import { resolveConfig } from "../../src/config/resolve.js";
import { trainSpec } from "../../src/config/schemas/train.js";
import { placeRun } from "../../src/train/placement.js";
import { type CudaProbe, probeCuda, rankDevices } from "../../src/trainer/devices.js";

const config = (...overrides: string[]) =>
  resolveConfig(trainSpec, { overrides: ["model.path=/m", ...overrides] });

/** A probe over devices that are usable (listed) or not, recording what it was asked. */
function probe(usable: string[], nccl = true) {
  const asked: string[] = [];
  const run = async (device: string): Promise<CudaProbe> => {
    asked.push(device);
    return usable.includes(device)
      ? { available: true, reason: "", nccl }
      : { available: false, reason: "no CUDA GPU is visible", nccl };
  };
  return { run, asked };
}

describe("placeRun", () => {
  it("one rank keeps the config as it is and probes nothing", async () => {
    const p = probe([]);
    expect(await placeRun(config("trainer.device=cuda"), p.run, {})).toEqual({
      trainer: { device: "cuda", devices: null },
      engine: { replicas: 1, devices: null },
      notes: [],
    });
    expect(p.asked).toEqual([]);
  });

  it("CPU ranks and CPU replicas: N of each, the environment inherited, nothing probed", async () => {
    const p = probe([]);
    const placed = await placeRun(
      config("trainer.gpus=2", "trainer.device=cpu", "rollout.engine_device=cpu"),
      p.run,
      {},
    );
    expect(placed).toEqual({
      trainer: { device: "cpu", devices: null },
      engine: { replicas: 2, device: "cpu", devices: null },
      notes: [],
    });
    expect(p.asked).toEqual([]);
  });

  it("GPUs: rank r and replica r see device r, from CUDA_VISIBLE_DEVICES when it is set", async () => {
    const p = probe(["0", "1", "4", "5"]);
    expect(await placeRun(config("trainer.gpus=2"), p.run, {})).toEqual({
      trainer: { device: "cuda", devices: ["0", "1"] },
      engine: { replicas: 2, device: "cuda", devices: ["0", "1"] },
      notes: [],
    });
    const listed = await placeRun(config("trainer.gpus=2", "trainer.device=cuda"), p.run, {
      CUDA_VISIBLE_DEVICES: "4, 5,6",
    });
    expect(listed.trainer.devices).toEqual(["4", "5"]);
    expect(listed.engine.devices).toEqual(["4", "5"]);
    // Trainer ranks on the CPU, engine replicas on the GPUs.
    const mixed = await placeRun(config("trainer.gpus=2", "trainer.device=cpu"), p.run, {});
    expect(mixed.trainer).toEqual({ device: "cpu", devices: null });
    expect(mixed.engine).toEqual({ replicas: 2, device: "cuda", devices: ["0", "1"] });
  });

  it("auto without a usable GPU runs on the CPU and says so", async () => {
    const placed = await placeRun(config("trainer.gpus=2"), probe([]).run, {});
    expect(placed.trainer).toEqual({ device: "cpu", devices: null });
    expect(placed.engine).toEqual({ replicas: 2, device: "cpu", devices: null });
    expect(placed.notes).toEqual([
      "trainer.device=auto: no usable GPU (no CUDA GPU is visible); the 2 trainer ranks run on the CPU",
      "rollout.engine_device=auto: no usable GPU (no CUDA GPU is visible); the 2 engine replicas run on the CPU",
    ]);
    const hidden = await placeRun(config("trainer.gpus=2"), probe(["0", "1"]).run, {
      CUDA_VISIBLE_DEVICES: "",
    });
    expect(hidden.trainer.device).toBe("cpu");
    expect(hidden.notes[0]).toMatch(/CUDA_VISIBLE_DEVICES is set empty/);
  });

  it("refuses what cannot run, naming the key and the device", async () => {
    const cuda = config("trainer.gpus=2", "trainer.device=cuda");
    await expect(placeRun(cuda, probe(["0"]).run, {})).rejects.toThrow(
      "trainer.device=cuda with trainer.gpus=2: device 1 (CUDA_VISIBLE_DEVICES=1) is not usable: no CUDA GPU is visible",
    );
    await expect(placeRun(config("trainer.gpus=2"), probe(["0"]).run, {})).rejects.toThrow(
      /^trainer\.gpus=2 with trainer\.device=auto: device 1 is not usable \(no CUDA GPU is visible\) while 0 are/,
    );
    await expect(
      placeRun(cuda, probe(["0", "1"]).run, { CUDA_VISIBLE_DEVICES: "3" }),
    ).rejects.toThrow(
      "trainer.gpus=2 but CUDA_VISIBLE_DEVICES=3 names 1 device: one device per rank",
    );
    await expect(placeRun(cuda, probe([]).run, { CUDA_VISIBLE_DEVICES: "" })).rejects.toThrow(
      /trainer\.device=cuda with trainer\.gpus=2: CUDA_VISIBLE_DEVICES is set empty/,
    );
    await expect(placeRun(cuda, probe(["0", "1"], false).run, {})).rejects.toThrow(
      /trainer\.gpus=2 on CUDA: this searchr1-trainer is built without NCCL ranks/,
    );
    await expect(
      placeRun(
        config("trainer.gpus=2", "trainer.device=cpu", "rollout.engine_device=cuda"),
        probe(["1"]).run,
        {},
      ),
    ).rejects.toThrow(/^rollout\.engine_device=cuda with trainer\.gpus=2: device 0 /);
  });

  it("an engine at rollout.engine_url is the one engine: no replicas started", async () => {
    const p = probe([]);
    const placed = await placeRun(
      config(
        "trainer.gpus=2",
        "trainer.device=cpu",
        "rollout.engine=sglang",
        "rollout.engine_url=http://10.0.0.1:30000",
      ),
      p.run,
      {},
    );
    expect(placed.engine).toEqual({ replicas: 1, devices: null });
    expect(placed.notes).toEqual([
      "rollout.engine_url: the engine at http://10.0.0.1:30000 serves every trajectory of the 2 ranks (its replicas, if any, are its own)",
    ]);
    expect(p.asked).toEqual([]);
  });

  it("rankDevices reads CUDA_VISIBLE_DEVICES", () => {
    expect(rankDevices(3, {})).toEqual(["0", "1", "2"]);
    expect(rankDevices(2, { CUDA_VISIBLE_DEVICES: "GPU-aa,GPU-bb" })).toEqual(["GPU-aa", "GPU-bb"]);
    expect(rankDevices(2, { CUDA_VISIBLE_DEVICES: " " })).toBeNull();
  });

  it("the real probe runs searchr1-trainer info seeing one device", async () => {
    const p = await probeCuda("0");
    expect(typeof p.available).toBe("boolean");
    if (!p.available) expect(p.reason).not.toBe("");
  });
});
