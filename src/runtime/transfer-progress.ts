import cliProgress from "cli-progress";
import { formatBytes } from "./progress.js";

/** Progress of one file in a multi-file transfer. */
export interface FileProgress {
  add(bytes: number): void;
  /** Removes the file's bar and prints one line about it. */
  done(note: string): void;
}

/** Several files moving at once: a bar per active file plus a total, or plain lines. */
export interface TransferProgress {
  /** `already` bytes were there from an earlier run and count as done. */
  file(label: string, size: number, already: number): FileProgress;
  log(message: string): void;
  stop(): void;
}

export interface TransferProgressOptions {
  total: number;
  quiet?: boolean;
  stream?: NodeJS.WriteStream;
  /** Seconds between plain lines when the stream is not a terminal. */
  intervalS?: number;
}

/** Bytes moved since the start and the rate and ETA that follow from them. */
class Meter {
  readonly started = Date.now();
  moved = 0;
  constructor(readonly total: number) {}
  get rate(): number {
    return this.moved / Math.max((Date.now() - this.started) / 1000, 1e-3);
  }
  get etaS(): number {
    return this.rate > 0
      ? Math.max(0, this.total - this.moved) / this.rate
      : Number.POSITIVE_INFINITY;
  }
}

export function formatDuration(s: number): string {
  if (!Number.isFinite(s)) return "?";
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m${String(Math.round(s % 60)).padStart(2, "0")}s`;
  return `${Math.floor(m / 60)}h${String(m % 60).padStart(2, "0")}m`;
}

export function createTransferProgress(options: TransferProgressOptions): TransferProgress {
  const stream = options.stream ?? process.stderr;
  if (options.quiet) {
    return {
      file: () => ({ add() {}, done() {} }),
      log() {},
      stop() {},
    };
  }
  const meter = new Meter(options.total);
  return stream.isTTY
    ? ttyTransfer(stream, meter)
    : plainTransfer(stream, meter, (options.intervalS ?? 10) * 1000);
}

function ttyTransfer(stream: NodeJS.WriteStream, meter: Meter): TransferProgress {
  const multi = new cliProgress.MultiBar(
    {
      stream,
      hideCursor: true,
      clearOnComplete: false,
      autopadding: true,
      format: "{label} [{bar}] {percentage}% | {amount} | {rate}/s | ETA {left}",
    },
    cliProgress.Presets.shades_classic,
  );
  const payload = (done: number, total: number, rate: number, eta: number, label: string) => ({
    label: label.length > 28 ? `…${label.slice(-27)}` : label.padEnd(28),
    amount: `${formatBytes(done)} / ${formatBytes(total)}`,
    rate: formatBytes(rate),
    // cli-progress reserves {eta} for its own estimate; ours comes from bytes and rate.
    left: formatDuration(eta),
  });
  const totalBar = multi.create(
    Math.max(meter.total, 1),
    0,
    payload(0, meter.total, 0, 0, "total"),
  );
  const refreshTotal = () =>
    totalBar.update(
      meter.moved,
      payload(meter.moved, meter.total, meter.rate, meter.etaS, "total"),
    );
  return {
    file(label, size, already) {
      const started = Date.now();
      let done = already;
      const bar = multi.create(Math.max(size, 1), already, payload(already, size, 0, 0, label));
      return {
        add(bytes) {
          done += bytes;
          meter.moved += bytes;
          const rate = (done - already) / Math.max((Date.now() - started) / 1000, 1e-3);
          bar.update(done, payload(done, size, rate, (size - done) / Math.max(rate, 1), label));
          refreshTotal();
        },
        done(note) {
          // Logged lines are printed on the next redraw, which removing the bar forces.
          multi.log(`${label}: ${note}\n`);
          multi.remove(bar);
        },
      };
    },
    log(message) {
      multi.log(`${message}\n`);
      multi.update();
    },
    stop() {
      refreshTotal();
      multi.update();
      multi.stop();
    },
  };
}

function plainTransfer(
  stream: NodeJS.WriteStream,
  meter: Meter,
  intervalMs: number,
): TransferProgress {
  const active = new Map<string, { done: number; size: number }>();
  let last = Date.now();
  const line = () => {
    const pct = meter.total > 0 ? ` (${((100 * meter.moved) / meter.total).toFixed(1)}%)` : "";
    const files = [...active]
      .map(([label, f]) => `${label} ${((100 * f.done) / Math.max(f.size, 1)).toFixed(0)}%`)
      .join(", ");
    stream.write(
      `downloaded ${formatBytes(meter.moved)} of ${formatBytes(meter.total)}${pct}, ${formatBytes(meter.rate)}/s, ETA ${formatDuration(meter.etaS)}${files ? `; ${files}` : ""}\n`,
    );
  };
  const tick = () => {
    const now = Date.now();
    if (now - last >= intervalMs) {
      last = now;
      line();
    }
  };
  return {
    file(label, size, already) {
      const state = { done: already, size };
      active.set(label, state);
      return {
        add(bytes) {
          state.done += bytes;
          meter.moved += bytes;
          tick();
        },
        done(note) {
          active.delete(label);
          stream.write(`${label}: ${note}\n`);
        },
      };
    },
    log(message) {
      stream.write(`${message}\n`);
    },
    stop() {
      if (meter.moved > 0) line();
    },
  };
}
