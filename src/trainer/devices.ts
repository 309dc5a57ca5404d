import { execa } from "execa";
import { UsageError } from "../runtime/errors.js";
import { nativeExecutable } from "../runtime/native-executable.js";

/** What `searchr1-trainer info` says of CUDA with one device visible. */
export interface CudaProbe {
  /** A GPU is visible, has bf16 tensor cores, and cuBLASLt loaded (`--device auto` picks CUDA). */
  available: boolean;
  /** Why not, when not. */
  reason: string;
  /** The build has NCCL ranks (`serve --world-size` > 1 on CUDA). */
  nccl: boolean;
}

/**
 * `searchr1-trainer info` run with only `device` visible (`CUDA_VISIBLE_DEVICES=device`): what
 * a trainer rank or an engine replica given that device would find. The engine is built on
 * the same backend, so its `--device auto` decides alike.
 */
export async function probeCuda(device: string): Promise<CudaProbe> {
  const result = await execa(nativeExecutable("searchr1-trainer"), ["info"], {
    env: { CUDA_VISIBLE_DEVICES: device },
    reject: false,
    timeout: 120_000,
  });
  try {
    const info = JSON.parse(String(result.stdout)) as {
      cuda: { available: boolean; reason: string };
      ranks?: { nccl?: boolean };
    };
    return {
      available: info.cuda.available === true,
      reason: info.cuda.reason,
      nccl: info.ranks?.nccl === true,
    };
  } catch {
    const said = String(result.stderr).trim().split("\n").slice(-3).join(" / ");
    return {
      available: false,
      reason: `searchr1-trainer info failed (${result.exitCode ?? result.signal}): ${said}`,
      nccl: false,
    };
  }
}

/**
 * The CUDA device of each of `n` ranks, rank 0 first, as `CUDA_VISIBLE_DEVICES` names them:
 * its first n entries when it is set (so `CUDA_VISIBLE_DEVICES=4,5 train --gpus 2` runs on 4
 * and 5), else 0 to n − 1; null when it is set empty (no GPU is to be used). Refused naming
 * the variable when it lists fewer than n.
 */
export function rankDevices(n: number, env: NodeJS.ProcessEnv = process.env): string[] | null {
  const set = env.CUDA_VISIBLE_DEVICES;
  if (set === undefined) return Array.from({ length: n }, (_, i) => String(i));
  const listed = set
    .split(",")
    .map((d) => d.trim())
    .filter((d) => d !== "");
  if (listed.length === 0) return null;
  if (listed.length < n) {
    throw new UsageError(
      `trainer.gpus=${n} but CUDA_VISIBLE_DEVICES=${set} names ${listed.length} device` +
        `${listed.length === 1 ? "" : "s"}: one device per rank; lower trainer.gpus or name more`,
    );
  }
  return listed.slice(0, n);
}
