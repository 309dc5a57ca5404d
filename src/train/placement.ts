import type { TrainConfig } from "../config/schemas/train.js";
import { UsageError } from "../runtime/errors.js";
import { type CudaProbe, probeCuda, rankDevices } from "../trainer/devices.js";

type Device = "auto" | "cpu" | "cuda";

/**
 * Where the trainer ranks and the engine replicas of a run go. With `trainer.gpus` N > 1:
 * N trainer ranks and N native engine replicas, rank r and replica r on device r, each seeing
 * only that device (`CUDA_VISIBLE_DEVICES`), so the two share it (rollout.gpu_memory_utilization
 * bounds the engine's part); or all on the CPU, sharing the cores.
 */
export interface Placement {
  trainer: {
    /** trainer.device, with auto decided when there are several ranks. */
    device: Device;
    /** The device each rank sees, rank 0 first; null: as inherited (one rank, or the CPU). */
    devices: string[] | null;
  };
  engine: {
    /** Native engine replicas to start: N, or 1 (one rank, or the engine at rollout.engine_url). */
    replicas: number;
    /** rollout.engine_device with auto decided; absent: as configured. */
    device?: "cpu" | "cuda";
    /** The device each replica sees, replica 0 first; null: as inherited. */
    devices: string[] | null;
  };
  /** What was decided that the run should say. */
  notes: string[];
}

/**
 * The placement of a run's ranks and replicas on this node. For N > 1 (or ranks on several
 * nodes) on a device that is not the CPU, each device is probed (`searchr1-trainer info`
 * seeing it alone): `cuda` must be usable on every one (else refused naming the device and
 * why); `auto` takes CUDA when every device is usable and the CPU when none is, and refuses a
 * mix (ranks on CUDA and on the CPU cannot meet). One rank of one node keeps the config as it
 * is.
 */
export async function placeRun(
  config: Pick<TrainConfig, "trainer" | "rollout">,
  probe: (device: string) => Promise<CudaProbe> = probeCuda,
  env: NodeJS.ProcessEnv = process.env,
): Promise<Placement> {
  const n = config.trainer.gpus;
  const { rollout } = config;
  const native = rollout.engine === "native" && rollout.engine_url === null;
  // One rank of one node keeps auto; ranks that meet must agree on the device, so the ranks of
  // several nodes decide it on each node (and node 0 checks that they agree).
  if (n === 1 && config.trainer.nnodes === 1) {
    return {
      trainer: { device: config.trainer.device, devices: null },
      engine: { replicas: 1, devices: null },
      notes: [],
    };
  }
  const notes: string[] = [];
  if (!native && rollout.engine_url !== null) {
    notes.push(
      `rollout.engine_url: the engine at ${rollout.engine_url} serves every trajectory of the ` +
        `${n} ranks (its replicas, if any, are its own)`,
    );
  }
  const wanted: Device[] = [config.trainer.device, ...(native ? [rollout.engine_device] : [])];
  let devices: string[] | null = null;
  let probes: CudaProbe[] = [];
  if (wanted.some((d) => d !== "cpu")) {
    devices = rankDevices(n, env);
    probes = devices ? await Promise.all(devices.map((d) => probe(d))) : [];
  }
  const decide = (device: Device, key: string, what: string): "cpu" | "cuda" => {
    if (device === "cpu") return "cpu";
    if (!devices) {
      if (device === "cuda") {
        throw new UsageError(
          `${key}=cuda with trainer.gpus=${n}: CUDA_VISIBLE_DEVICES is set empty, so no GPU is to be used`,
        );
      }
      notes.push(`${key}=auto: CUDA_VISIBLE_DEVICES is set empty; the ${n} ${what} run on the CPU`);
      return "cpu";
    }
    const unusable = devices.flatMap((d, i) => {
      const p = probes[i] as CudaProbe;
      return p.available ? [] : [{ device: d, reason: p.reason }];
    });
    const first = unusable[0];
    if (!first) return "cuda";
    if (device === "cuda") {
      throw new UsageError(
        `${key}=cuda with trainer.gpus=${n}: device ${first.device} ` +
          `(CUDA_VISIBLE_DEVICES=${first.device}) is not usable: ${first.reason}`,
      );
    }
    if (unusable.length === n) {
      notes.push(`${key}=auto: no usable GPU (${first.reason}); the ${n} ${what} run on the CPU`);
      return "cpu";
    }
    throw new UsageError(
      `trainer.gpus=${n} with ${key}=auto: device ${first.device} is not usable ` +
        `(${first.reason}) while ${devices.filter((d) => !unusable.some((u) => u.device === d)).join(",")} ` +
        `are: set trainer.gpus to the number of usable GPUs (one per rank), or ${key}=cpu`,
    );
  };
  const trainer = decide(config.trainer.device, "trainer.device", "trainer ranks");
  if (trainer === "cuda" && !probes[0]?.nccl) {
    throw new UsageError(
      `trainer.gpus=${n} on CUDA: this searchr1-trainer is built without NCCL ranks ` +
        "(`searchr1-trainer info` says ranks.nccl false); rebuild it (npm run build:native), " +
        "or set trainer.device=cpu",
    );
  }
  const engine = native
    ? decide(rollout.engine_device, "rollout.engine_device", "engine replicas")
    : null;
  return {
    trainer: { device: trainer, devices: trainer === "cuda" ? devices : null },
    engine: engine
      ? { replicas: n, device: engine, devices: engine === "cuda" ? devices : null }
      : { replicas: 1, devices: null },
    notes,
  };
}
