/**
 * The run's plots, regenerated as training goes: the charts of `plot-specs.ts` compiled with
 * vega-lite, rendered headless to SVG by vega (no canvas, no browser) and to PNG by resvg
 * (white background, system fonts). Each file is written atomically, so a reader never sees
 * half an image; a chart whose metrics are all absent is not written.
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { Resvg } from "@resvg/resvg-js";
import { parse, View } from "vega";
import { compile, type TopLevelSpec } from "vega-lite";
import { writeFileAtomic } from "../runtime/write-atomic.js";
import { type ChartSpec, chartSpecs, PLOT_WIDTH, type PlotRow } from "./plot-specs.js";

export interface WritePlotsOptions {
  /** PNG pixels per SVG pixel (default 2: a PLOT_WIDTH chart becomes a 1280-pixel PNG). */
  pngScale?: number;
}

/** The SVG text of a vega-lite spec (inline data only: nothing is loaded). */
export async function renderSvg(spec: TopLevelSpec): Promise<string> {
  const view = new View(parse(compile(spec).spec), { renderer: "none" });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}

/** A PNG of the SVG scaled to `width` pixels, on white (never transparent). */
export function svgToPng(svg: string, width: number): Uint8Array {
  const resvg = new Resvg(svg, {
    background: "white",
    fitTo: { mode: "width", value: width },
    font: { loadSystemFonts: true, defaultFontFamily: "DejaVu Sans" },
  });
  return resvg.render().asPng();
}

/** Renders one chart and writes `<dir>/<name>.svg` and `<dir>/<name>.png`; returns both paths. */
export async function writeChart(chart: ChartSpec, dir: string, pngScale = 2): Promise<string[]> {
  const svg = await renderSvg(chart.spec);
  const png = svgToPng(svg, Math.round(PLOT_WIDTH * pngScale));
  const svgPath = join(dir, `${chart.name}.svg`);
  const pngPath = join(dir, `${chart.name}.png`);
  writeFileAtomic(svgPath, svg);
  writeFileAtomic(pngPath, png);
  return [svgPath, pngPath];
}

/**
 * Writes every chart that has data (reward, validation, behaviour, length, optimisation,
 * timing) as SVG and PNG into `dir` (created if missing) and returns the written paths.
 * Charts are rendered one after another to leave the cores to the run.
 */
export async function writePlots(
  rows: readonly PlotRow[],
  dir: string,
  options: WritePlotsOptions = {},
): Promise<string[]> {
  mkdirSync(dir, { recursive: true });
  const written: string[] = [];
  for (const chart of chartSpecs(rows)) {
    written.push(...(await writeChart(chart, dir, options.pngScale ?? 2)));
  }
  return written;
}
