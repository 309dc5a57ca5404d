import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { README_BEGIN, README_END, readmeConfigSection } from "../src/config/readme-section.js";

const readme = readFileSync(new URL("../README.md", import.meta.url), "utf8");

describe("README", () => {
  it("has the config reference generated from the current schemas", () => {
    const section = readme.slice(
      readme.indexOf(README_BEGIN),
      readme.indexOf(README_END) + README_END.length,
    );
    expect(section).toBe(readmeConfigSection());
  });

  it("gives the test command that CI runs", () => {
    const ci = readFileSync(new URL("../.ci/run", import.meta.url), "utf8");
    expect(readme).toContain("npm test");
    expect(ci).toMatch(/^npm test$/m);
  });
});
