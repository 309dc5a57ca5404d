import cliProgress from "cli-progress";

/** One unit of long work: a bar on a terminal, periodic plain lines otherwise. */
export interface ProgressTask {
  /** Sets the amount done so far (same unit as the total), and a short status such as "EM 0.41". */
  update(done: number, detail?: string): void;
  /** Marks the task finished and prints its last state. */
  finish(): void;
}

export interface Progress {
  task(label: string, total: number | undefined, unit: string): ProgressTask;
  /** A message that must not be torn by a bar being redrawn. */
  log(message: string): void;
}

export interface ProgressOptions {
  /** Stream progress goes to; stderr so that stdout stays machine-readable. */
  stream?: NodeJS.WriteStream;
  quiet?: boolean;
  /** Seconds between plain lines when the stream is not a terminal. */
  intervalS?: number;
}

/** Bytes in binary units: "512 B", "1.5 GiB". */
export function formatBytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

export function formatAmount(n: number, unit: string): string {
  if (unit === "B") return formatBytes(n);
  return `${Math.round(n).toLocaleString("en-US")} ${unit}`;
}

/** Chooses the display from the stream: interactive bar on a TTY, timestamped-free plain lines elsewhere. */
export function createProgress(options: ProgressOptions = {}): Progress {
  const stream = options.stream ?? process.stderr;
  if (options.quiet) {
    return { task: () => ({ update() {}, finish() {} }), log: () => {} };
  }
  if (stream.isTTY) return ttyProgress(stream);
  return plainProgress(stream, (options.intervalS ?? 10) * 1000);
}

function ttyProgress(stream: NodeJS.WriteStream): Progress {
  return {
    task(label, total, unit) {
      const withTotal = total !== undefined && total > 0;
      const bar = new cliProgress.SingleBar(
        {
          stream,
          format: withTotal
            ? `${label} [{bar}] {percentage}% | {amount} | {rate}/s | ETA {eta_formatted}{detail}`
            : `${label} {amount} | {rate}/s{detail}`,
          hideCursor: true,
          clearOnComplete: false,
          etaBuffer: 50,
        },
        cliProgress.Presets.shades_classic,
      );
      const started = Date.now();
      const payload = (done: number, detail?: string) => ({
        amount: formatAmount(done, unit),
        rate: formatAmount(done / Math.max((Date.now() - started) / 1000, 1e-3), unit),
        detail: detail ? ` | ${detail}` : "",
      });
      bar.start(withTotal ? total : 1, 0, payload(0));
      return {
        update(done, detail) {
          bar.update(withTotal ? Math.min(done, total) : 0, payload(done, detail));
        },
        finish() {
          bar.stop();
        },
      };
    },
    log(message) {
      stream.write(`${message}\n`);
    },
  };
}

function plainProgress(stream: NodeJS.WriteStream, intervalMs: number): Progress {
  return {
    task(label, total, unit) {
      const started = Date.now();
      let last = started;
      let current = 0;
      let status = "";
      const line = () => {
        const secs = (Date.now() - started) / 1000;
        const pct = total ? ` (${((100 * current) / total).toFixed(1)}%)` : "";
        const rate = formatAmount(current / Math.max(secs, 1e-3), unit);
        stream.write(
          `${label}: ${formatAmount(current, unit)}${pct}, ${rate}/s, ${secs.toFixed(1)} s${status}\n`,
        );
      };
      return {
        update(done, detail) {
          current = done;
          status = detail ? `, ${detail}` : "";
          const now = Date.now();
          if (now - last >= intervalMs) {
            last = now;
            line();
          }
        },
        finish: line,
      };
    },
    log(message) {
      stream.write(`${message}\n`);
    },
  };
}
