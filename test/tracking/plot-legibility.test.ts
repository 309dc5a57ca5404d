/**
 * The plots stay readable: every word is drawn from the bundled font with system fonts off (a
 * GPU server without fonts drew lines and no text), and the reward chart never lets one line
 * hide the other. The pixels come from resvg's raw RGBA (`rasterize`, the function `svgToPng`
 * and so `writePlots` draw with), so no PNG decoder is needed.
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { RenderedImage } from "@resvg/resvg-js";
import { afterAll, describe, expect, it } from "vitest";
import {
  PLOT_FONT_FAMILY,
  PLOT_WIDTH,
  type PlotRow,
  REWARD_IS_EM,
  rewardIsExactMatch,
  rewardSpec,
} from "../../src/tracking/plot-specs.js";
import { bundledFonts, rasterize, renderSvg, writePlots } from "../../src/tracking/plots.js";

const TITLE = "Reward and exact match (training batches)";
const BLUE = [0x4c, 0x78, 0xa8]; // reward (mean)
const ORANGE = [0xf5, 0x85, 0x18]; // exact match (mean)

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** 40 steps rising from 0.2 towards 0.9 with a wobble; exact match = reward unless `apart` says. */
function rewardRows(apart: (step: number) => number = () => 0): PlotRow[] {
  return Array.from({ length: 40 }, (_, i) => {
    const step = i + 1;
    const em = 0.2 + 0.7 * (1 - Math.exp(-i / 4)) + 0.05 * Math.sin(i);
    return { step, "reward/mean": em + apart(step), "em/mean": em };
  });
}

/** The SVG with the content of every `<text>` whose content is `content` emptied. */
function withoutText(svg: string, content: string): string {
  const out = svg.replaceAll(`>${content}</text>`, "></text>");
  expect(out).not.toBe(svg);
  return out;
}

/** The texts of an SVG's `<text>` elements (vega writes each on one line, no tspans here). */
function texts(svg: string): string[] {
  return [...svg.matchAll(/<text [^>]*>([^<]+)<\/text>/g)].map((m) => m[1] as string);
}

interface Difference {
  /** Pixels that differ between the two images. */
  count: number;
  /** Of those, pixels that are dark in the first image (ink, not a faint anti-aliased edge). */
  dark: number;
  /** The lowest row (in pixels from the top) with a difference; -1 when none. */
  lastRow: number;
}

function difference(a: RenderedImage, b: RenderedImage): Difference {
  expect([a.width, a.height]).toEqual([b.width, b.height]);
  const pa = a.pixels;
  const pb = b.pixels;
  expect(pa.length).toBe(a.width * a.height * 4);
  let count = 0;
  let dark = 0;
  let lastRow = -1;
  for (let i = 0; i < pa.length; i += 4) {
    if (pa[i] === pb[i] && pa[i + 1] === pb[i + 1] && pa[i + 2] === pb[i + 2]) continue;
    count++;
    if (Math.max(pa[i] as number, pa[i + 1] as number, pa[i + 2] as number) < 96) dark++;
    lastRow = Math.max(lastRow, Math.floor(i / 4 / a.width));
  }
  return { count, dark, lastRow };
}

/** Pixels within a small distance of an RGB colour (a line's body, not its blended edges). */
function pixelsOf(image: RenderedImage, rgb: readonly number[]): number {
  const p = image.pixels;
  let n = 0;
  for (let i = 0; i < p.length; i += 4) {
    const d =
      Math.abs((p[i] as number) - (rgb[0] as number)) +
      Math.abs((p[i + 1] as number) - (rgb[1] as number)) +
      Math.abs((p[i + 2] as number) - (rgb[2] as number));
    if (d <= 24) n++;
  }
  return n;
}

describe("plot text without system fonts", () => {
  it("draws the title in dark ink from the bundled font, above the chart", async () => {
    const svg = await renderSvg(rewardSpec(rewardRows((s) => (s > 20 ? 0.05 : 0))) ?? {});
    expect(svg).toContain(`font-family="'${PLOT_FONT_FAMILY}', sans-serif"`);
    const width = PLOT_WIDTH * 2; // as writePlots draws the PNG
    const fonts = bundledFonts();
    expect(fonts.files.map((f) => f.split(/[\\/]/).at(-1))).toEqual([
      "DejaVuSans.ttf",
      "DejaVuSans-Bold.ttf",
    ]);

    const title = difference(rasterize(svg, width), rasterize(withoutText(svg, TITLE), width));
    // 41 bold 15-pixel letters at scale 2: thousands of pixels, most of them black
    expect(title.count).toBeGreaterThan(3000);
    expect(title.dark).toBeGreaterThan(title.count / 3);
    expect(title.lastRow).toBeLessThan(40 * 2); // the title line, above subtitle and plot

    // the check sees the bug: with no font file at all (a server without fonts, as rendering
    // with system fonts used to be there) the title draws nothing
    const none = { files: [], family: PLOT_FONT_FAMILY };
    const blind = difference(
      rasterize(svg, width, none),
      rasterize(withoutText(svg, TITLE), width, none),
    );
    expect(blind.count).toBe(0);

    // the family the SVG names is the bundled file's own: with the fallback family pointing
    // nowhere, the title is still drawn only because 'DejaVu Sans' is found by name
    const byName = { files: fonts.files, family: "No Such Family" };
    const named = difference(
      rasterize(svg, width, byName),
      rasterize(withoutText(svg, TITLE), width, byName),
    );
    expect(named.count).toBe(title.count);
  });

  it("draws every word of the chart: title, subtitle, ticks, axis titles, legend", async () => {
    const svg = await renderSvg(rewardSpec(rewardRows((s) => (s > 20 ? 0.05 : 0))) ?? {});
    const words = [...new Set(texts(svg))];
    for (const w of [TITLE, "score", "step", "0.8", "40", "reward (mean)", "exact match (mean)"]) {
      expect(words).toContain(w);
    }
    const full = rasterize(svg, PLOT_WIDTH);
    for (const word of words) {
      const d = difference(full, rasterize(withoutText(svg, word), PLOT_WIDTH));
      expect(d.count, `pixels of "${word}"`).toBeGreaterThan(10);
    }
  });

  it("writes the same PNG as rasterize draws with the bundled fonts", async () => {
    const dir = mkdtempSync(join(tmpdir(), "searchr1-legibility-"));
    dirs.push(dir);
    await writePlots(rewardRows(), dir);
    const svg = readFileSync(join(dir, "reward.svg"), "utf8");
    const png = readFileSync(join(dir, "reward.png"));
    expect(png.equals(rasterize(svg, PLOT_WIDTH * 2).asPng())).toBe(true);
    const none = { files: [], family: PLOT_FONT_FAMILY };
    expect(png.equals(rasterize(svg, PLOT_WIDTH * 2, none).asPng())).toBe(false);
  });
});

describe("reward and exact match when they agree", () => {
  it("tells a reward equal to exact match at every step", () => {
    expect(rewardIsExactMatch(rewardRows())).toBe(true);
    expect(rewardIsExactMatch(rewardRows((s) => (s === 40 ? 0.01 : 0)))).toBe(false);
    // one of them missing at a step where the other is logged: not the same series
    expect(rewardIsExactMatch([...rewardRows(), { step: 41, "reward/mean": 0.5 }])).toBe(false);
    expect(rewardIsExactMatch([...rewardRows(), { step: 41, "em/mean": 0.5 }])).toBe(false);
    // summed in another order: still equal; steps with neither are ignored
    expect(
      rewardIsExactMatch([
        { step: 1, "reward/mean": 0.1 + 0.2, "em/mean": 0.3 },
        { step: 2, "actor/lr": 1e-6 },
      ]),
    ).toBe(true);
    expect(rewardIsExactMatch([{ step: 1, "reward/mean": 0.5 }])).toBe(false);
    expect(rewardIsExactMatch([])).toBe(false);
  });

  it("draws one line labelled 'reward = exact match' when they agree at every step", async () => {
    const svg = await renderSvg(rewardSpec(rewardRows()) ?? {});
    const words = texts(svg);
    expect(words).toContain(REWARD_IS_EM.label);
    expect(words).not.toContain("reward (mean)");
    expect(words).not.toContain("exact match (mean)");
    expect(words.find((w) => w.startsWith("step 40: "))).toMatch(
      /^step 40: reward = exact match \(mean\) 0\.\d{3}$/,
    );
    const image = rasterize(svg, PLOT_WIDTH * 2);
    expect(pixelsOf(image, BLUE)).toBeGreaterThan(2000); // a 4-pixel line across the chart
    expect(pixelsOf(image, ORANGE)).toBe(0);
  });

  it("dashes exact match over solid reward so both lines show where they run together", async () => {
    // equal at 39 of 40 steps: two series, nearly one path
    const rows = rewardRows((s) => (s === 40 ? 0.02 : 0));
    const svg = await renderSvg(rewardSpec(rows) ?? {});
    expect(texts(svg)).toEqual(expect.arrayContaining(["reward (mean)", "exact match (mean)"]));
    const dashOf = (colour: string) =>
      [...svg.matchAll(/<path [^>]*stroke="(#[0-9a-f]{6})"[^>]*>/g)]
        .filter((m) => m[1] === colour)
        .map((m) => /stroke-dasharray="([^"]*)"/.exec(m[0])?.[1] ?? "none");
    // the line and its legend symbol each: reward solid, exact match dashed
    expect(dashOf("#4c78a8")).toEqual(["1,0", "1,0"]);
    expect(dashOf("#f58518")).toEqual(["7,4", "7,4"]);
    // the reward shows through the gaps along the whole line: against the pixels of one solid
    // line, over a quarter stay blue (a solid orange line on top would leave about a twentieth:
    // its last segment and the legend)
    const line = pixelsOf(
      rasterize(await renderSvg(rewardSpec(rewardRows()) ?? {}), PLOT_WIDTH * 2),
      BLUE,
    );
    const image = rasterize(svg, PLOT_WIDTH * 2);
    expect(pixelsOf(image, BLUE)).toBeGreaterThan(line / 4);
    expect(pixelsOf(image, ORANGE)).toBeGreaterThan(line / 2);
  });
});
