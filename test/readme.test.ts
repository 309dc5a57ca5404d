import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { buildProgram } from "../cli/program.js";
import {
  beginMarker,
  commandPage,
  endMarker,
  generatedSections,
  NATIVE_PAGES,
  nativeBuilt,
  sectionIn,
  withSection,
} from "../scripts/docs/sections.js";

const ROOT = fileURLToPath(new URL("../", import.meta.url));
const readme = readFileSync(join(ROOT, "README.md"), "utf8");
const SECTIONS = generatedSections();

describe("README", () => {
  it("gives the test command that CI runs", () => {
    const ci = readFileSync(join(ROOT, ".ci/run"), "utf8");
    expect(readme).toContain("npm test");
    expect(ci).toMatch(/^npm test$/m);
  });

  it("stays a front door", () => {
    expect(readme.split("\n").length).toBeLessThanOrEqual(400);
  });

  it("links every command's page", () => {
    for (const cmd of buildProgram().commands) {
      expect(readme).toContain(`(${commandPage(cmd)})`);
    }
    for (const name of NATIVE_PAGES) expect(readme).toContain(`(docs/commands/${name}.md)`);
  });
});

describe("the manual's generated sections", () => {
  it("has a page for every command, and one for each native executable", () => {
    const pages = [
      ...buildProgram().commands.map(commandPage),
      ...NATIVE_PAGES.map((n) => `docs/commands/${n}.md`),
    ];
    for (const page of pages) expect(existsSync(join(ROOT, page)), page).toBe(true);
  });

  it.each(SECTIONS)(
    "$page: its $name section is current (npm run docs rewrites it)",
    ({ page, name, body }) => {
      const text = readFileSync(join(ROOT, page), "utf8");
      expect(sectionIn(text, name), `${page} has no ${name} section`).toBeDefined();
      expect(sectionIn(text, name)).toBe(body);
    },
  );

  it("covers the native executables where they are built", () => {
    for (const name of NATIVE_PAGES) {
      const has = SECTIONS.some((s) => s.page === `docs/commands/${name}.md`);
      expect(has).toBe(nativeBuilt(name));
    }
  });

  it("replaces only what lies between the markers", () => {
    const text = `before\n${beginMarker("help")}\n\nold\n\n${endMarker("help")}\nafter\n`;
    const next = withSection(text, "page.md", "help", "new");
    expect(next).toBe(`before\n${beginMarker("help")}\n\nnew\n\n${endMarker("help")}\nafter\n`);
    expect(sectionIn(next, "help")).toBe("new");
    expect(() => withSection("no markers", "page.md", "config", "x")).toThrow(/page.md/);
  });
});
