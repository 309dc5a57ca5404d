import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { inflateSync } from "node:zlib";
import { compile, type TopLevelSpec } from "vega-lite";
import { afterAll, describe, expect, it, vi } from "vitest";
import {
  behaviourSpec,
  chartSpecs,
  longTable,
  optimisationSpec,
  PLOT_WIDTH,
  type PlotRow,
  REWARD_SERIES,
  rewardSpec,
  validationSeries,
  validationSpec,
} from "../../src/tracking/plot-specs.js";
import { renderSvg, writePlots } from "../../src/tracking/plots.js";

const dirs: string[] = [];
function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "searchr1-plots-"));
  dirs.push(dir);
  return dir;
}
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** 40 steps; validation every 5 steps (and before training); some keys never or not always logged. */
function syntheticRows(steps = 40): PlotRow[] {
  const rows: PlotRow[] = [
    { step: 0, "val/em/nq": 0.1, "val/em/hotpotqa": 0.05, "val/em/mean": 0.075 },
  ];
  for (let step = 1; step <= steps; step++) {
    const t = step / steps;
    const row: Record<string, unknown> = {
      step,
      "reward/mean": 0.2 + 0.6 * t,
      "em/mean": 0.15 + 0.6 * t,
      "response_length/mean": 80 + 40 * t,
      "searches/mean": 0.3 + 1.2 * t,
      "turns/mean": 1.3 + 1.2 * t,
      "actor/kl_loss": 0.001 * t,
      "actor/entropy": 1.5 - t,
      "actor/grad_norm": step % 3 === 0 ? null : 2 + Math.sin(step),
      "actor/lr": 1e-6,
      "timing/step_s": 10 + t,
    };
    // valid_action/ratio, answer/ratio and actor/pg_clipfrac are never logged here
    if (step % 5 === 0) {
      row["val/em/nq"] = 0.1 + 0.5 * t;
      row["val/em/hotpotqa"] = 0.05 + 0.4 * t;
      row["val/em/mean"] = 0.075 + 0.45 * t;
    }
    rows.push(row);
  }
  return rows;
}

/** Width and height from a PNG's IHDR chunk (after the 8-byte signature and chunk header). */
function pngSize(png: Buffer): { width: number; height: number } {
  expect(png.subarray(0, 8)).toEqual(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
  expect(png.subarray(12, 16).toString("latin1")).toBe("IHDR");
  return { width: png.readUInt32BE(16), height: png.readUInt32BE(20) };
}

/**
 * RGBA of the top-left pixel of an 8-bit RGBA PNG. Whatever filter the first scanline uses, its
 * first pixel's bytes are stored raw (the neighbours it would be predicted from are zero).
 */
function firstPixel(png: Buffer): number[] {
  expect([png[24], png[25]]).toEqual([8, 6]); // bit depth 8, colour type RGBA
  const idat: Buffer[] = [];
  for (let at = 8; at < png.length; ) {
    const length = png.readUInt32BE(at);
    if (png.subarray(at + 4, at + 8).toString("latin1") === "IDAT") {
      idat.push(png.subarray(at + 8, at + 8 + length));
    }
    at += 12 + length;
  }
  return [...inflateSync(Buffer.concat(idat)).subarray(1, 5)];
}

/** Every element of the SVG is closed in order (a light well-formedness check, no XML parser). */
function expectBalancedTags(xml: string): void {
  const open: string[] = [];
  for (const m of xml.matchAll(/<(\/?)([A-Za-z][\w:-]*)[^>]*?(\/?)>/g)) {
    const [, closing, name, selfClosing] = m;
    if (selfClosing === "/") continue;
    if (closing === "/") expect(open.pop()).toBe(name);
    else open.push(name as string);
  }
  expect(open).toEqual([]);
}

describe("plot specs", () => {
  it("treats missing, null and non-finite values as absent and merges rows of one step", () => {
    const rows: PlotRow[] = [
      { step: 1, "reward/mean": 0.5 },
      { step: 2, "reward/mean": null, "em/mean": Number.NaN },
      { step: 3, "reward/mean": "0.7" },
      { "reward/mean": 0.9 },
      { step: 1, "em/mean": 0.25 },
      { step: 4, "reward/mean": 0.1 },
      { step: 4, "reward/mean": 0.2 },
    ];
    expect(longTable(rows, REWARD_SERIES)).toEqual([
      { step: 1, series: "reward (mean)", value: 0.5 },
      { step: 1, series: "exact match (mean)", value: 0.25 },
      { step: 4, series: "reward (mean)", value: 0.2 },
    ]);
  });

  it("returns null for charts without data and finds validation sources", () => {
    const rows: PlotRow[] = [{ step: 1, "reward/mean": 0.5 }];
    expect(validationSpec(rows)).toBeNull();
    expect(behaviourSpec(rows)).toBeNull();
    expect(optimisationSpec(rows)).toBeNull();
    expect(rewardSpec(rows)).not.toBeNull();
    expect(chartSpecs(rows).map((c) => c.name)).toEqual(["reward"]);
    expect(chartSpecs([]).length).toBe(0);
    expect(validationSeries(syntheticRows(5)).map((s) => s.key)).toEqual([
      "val/em/hotpotqa",
      "val/em/nq",
      "val/em/mean",
    ]);
  });

  it("the optimisation chart has a panel for each collapse sign that was logged", async () => {
    const rows: PlotRow[] = Array.from({ length: 6 }, (_, i) => ({
      step: i + 1,
      "actor/entropy": 1 - 0.1 * i,
      "actor/pg_clipfrac": 0.01 * i,
      "actor/grad_norm": 1 + i,
      "rollout_corr/kl": 1e-4 * i,
      "train/filtered_group_ratio": 0.5 - 0.05 * i,
      "response_length/mean": 100 + i,
    }));
    const spec = optimisationSpec(rows) as { facet: { sort: string[] } };
    expect(spec.facet.sort).toEqual([
      "entropy",
      "clip fraction",
      "grad norm",
      "engine–trainer KL",
      "filtered groups",
    ]);
    const svg = await renderSvg(optimisationSpec(rows) as TopLevelSpec);
    for (const label of [">entropy<", ">grad norm<", ">engine–trainer KL<", ">filtered groups<"]) {
      expect(svg).toContain(label);
    }
    // response length has its own chart
    expect(chartSpecs(rows).map((c) => c.name)).toEqual(["length", "optimisation"]);
  });

  it("compiles every chart without vega-lite warnings", () => {
    const warn = vi.spyOn(console, "warn").mockImplementation(() => {});
    try {
      const charts = chartSpecs(syntheticRows());
      expect(charts.map((c) => c.name)).toEqual([
        "reward",
        "validation",
        "behaviour",
        "length",
        "optimisation",
        "timing",
      ]);
      for (const c of charts) compile(c.spec);
      expect(warn).not.toHaveBeenCalled();
    } finally {
      warn.mockRestore();
    }
  });
});

describe("writePlots", () => {
  it("writes SVG and PNG per chart with data, atomically, and skips charts without data", async () => {
    const dir = tempDir();
    const rows = syntheticRows();
    const written = await writePlots(rows, dir);
    const names = ["reward", "validation", "behaviour", "length", "optimisation", "timing"];
    expect(written).toEqual(names.flatMap((n) => [join(dir, `${n}.svg`), join(dir, `${n}.png`)]));

    const svg = (name: string) => readFileSync(join(dir, `${name}.svg`), "utf8");
    for (const name of names) {
      const text = svg(name);
      expect(text).toMatch(/^<svg [^>]*xmlns="http:\/\/www.w3.org\/2000\/svg"/);
      expectBalancedTags(text);
      expect(text).toContain(">step</text>");
      expect(text).not.toContain("…"); // no truncated label
      const { width } = pngSize(readFileSync(join(dir, `${name}.png`)));
      expect(width).toBe(PLOT_WIDTH * 2);
      const svgWidth = Number(/<svg [^>]*width="([\d.]+)"/.exec(text)?.[1]);
      expect(Math.abs(svgWidth - PLOT_WIDTH)).toBeLessThanOrEqual(40);
    }
    for (const label of ["reward (mean)", "exact match (mean)", ">score<"]) {
      expect(svg("reward")).toContain(label);
    }
    for (const label of ["nq", "hotpotqa", "mean over sources", ">exact match<"]) {
      expect(svg("validation")).toContain(label);
    }
    // behaviour: the counts panel only (valid-action and answer ratios were never logged)
    expect(svg("behaviour")).toContain(">searches<");
    expect(svg("behaviour")).toContain(">turns<");
    expect(svg("behaviour")).toContain("per trajectory (mean)");
    expect(svg("behaviour")).not.toContain("valid actions");
    expect(svg("behaviour")).not.toContain("share of trajectories");
    // optimisation: a panel per logged metric, none for the clip fraction
    for (const label of [">KL loss<", ">entropy<", ">grad norm<"]) {
      expect(svg("optimisation")).toContain(label);
    }
    expect(svg("optimisation")).not.toContain("clip fraction");
    expect(svg("length")).toContain("tokens per trajectory");
    expect(svg("timing")).toContain(">whole step<");

    // the PNGs are opaque: the top-left pixel is white, not transparent
    for (const name of names) {
      expect(firstPixel(readFileSync(join(dir, `${name}.png`)))).toEqual([255, 255, 255, 255]);
    }

    // rewriting as the run goes replaces the files in place and leaves no temporary file
    const more = syntheticRows(45);
    const again = await writePlots(more, dir);
    expect(again).toEqual(written);
    expect(readdirSync(dir).sort()).toEqual(names.flatMap((n) => [`${n}.png`, `${n}.svg`]).sort());
    expect(svg("reward")).toContain("step 45:");
  });

  it("writes nothing for rows without any chart's metrics", async () => {
    const dir = tempDir();
    const written = await writePlots([{ step: 1, "actor/lr": 1e-6 }, { step: 2 }], dir);
    expect(written).toEqual([]);
    expect(readdirSync(dir)).toEqual([]);
  });

  it("draws a single step and a single-source validation", async () => {
    const dir = join(tempDir(), "plots", "nested");
    const written = await writePlots(
      [{ step: 1, "reward/mean": 0.4, "valid_action/ratio": 0.9, "val/em/mean": 0.3 }],
      dir,
    );
    expect(written.map((p) => p.slice(dir.length + 1))).toEqual([
      "reward.svg",
      "reward.png",
      "validation.svg",
      "validation.png",
      "behaviour.svg",
      "behaviour.png",
    ]);
    const behaviour = readFileSync(join(dir, "behaviour.svg"), "utf8");
    expect(behaviour).toContain("share of trajectories");
    expect(behaviour).not.toContain("per trajectory (mean)");
    expect(behaviour).toContain("<path"); // the single point is drawn
  });
});
