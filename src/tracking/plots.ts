/**
 * The run's plots, regenerated as training goes: the charts of `plot-specs.ts` compiled with
 * vega-lite, rendered headless to SVG by vega (no canvas, no browser) and to PNG by resvg
 * (white background, the bundled DejaVu Sans and never a system font: a GPU server without
 * fonts draws every word too). Each file is written atomically, so a reader never sees half an
 * image; a chart whose metrics are all absent is not written.
 */
import { mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { type RenderedImage, Resvg, type ResvgRenderOptions } from "@resvg/resvg-js";
import { parse, View } from "vega";
import { compile, type TopLevelSpec } from "vega-lite";
import { writeFileAtomic } from "../runtime/write-atomic.js";
import {
  type ChartSpec,
  chartSpecs,
  PLOT_FONT_FAMILY,
  PLOT_WIDTH,
  type PlotRow,
} from "./plot-specs.js";

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

/** The fonts the PNG renderer may use: these files and nothing else; `family` is theirs. */
export interface PlotFonts {
  files: readonly string[];
  family: string;
}

let bundled: PlotFonts | undefined;

/**
 * DejaVu Sans, regular and bold (vega's titles are bold), from the `dejavu-fonts-ttf` package:
 * TrueType, which resvg reads (it reads no WOFF/WOFF2). Resolved on first use.
 */
export function bundledFonts(): PlotFonts {
  if (bundled === undefined) {
    const require = createRequire(import.meta.url);
    bundled = {
      files: ["DejaVuSans.ttf", "DejaVuSans-Bold.ttf"].map((f) =>
        require.resolve(`dejavu-fonts-ttf/ttf/${f}`),
      ),
      family: PLOT_FONT_FAMILY,
    };
  }
  return bundled;
}

/**
 * The SVG drawn `width` pixels wide on white (never transparent), its text set only in `fonts`
 * (default: the bundled ones); system fonts are never loaded, so what a server without fonts
 * draws is what this draws anywhere. Its `pixels` are raw RGBA, `asPng()` the PNG file.
 */
export function rasterize(svg: string, width: number, fonts = bundledFonts()): RenderedImage {
  const family = fonts.family;
  const options: ResvgRenderOptions = {
    background: "white",
    fitTo: { mode: "width", value: width },
    font: {
      loadSystemFonts: false,
      fontFiles: [...fonts.files],
      defaultFontFamily: family,
      sansSerifFamily: family,
      serifFamily: family,
      monospaceFamily: family,
      cursiveFamily: family,
      fantasyFamily: family,
    },
  };
  return new Resvg(svg, options).render();
}

/** A PNG of the SVG scaled to `width` pixels (see `rasterize`). */
export function svgToPng(svg: string, width: number): Uint8Array {
  return rasterize(svg, width).asPng();
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
