// DAPO's group filter (dynamic sampling) and soft overlong punishment against
// make_offpolicy_fixtures.py (fixtures/dapo.json: verl's np.std > 0 rule and its DAPO reward
// manager's formula, with DAPO's −1 beyond the limit). Both are exact here: the filter
// compares values, and the penalty is one division (allowed 1e-15 relative).

import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { filterGroups } from "../../src/rl/filter-groups.js";
import { overlongPenalty } from "../../src/rl/overlong-reward.js";

const fx = JSON.parse(readFileSync(new URL("./fixtures/dapo.json", import.meta.url), "utf8")) as {
  filter_groups: { name: string; uids: string[]; values: number[]; kept: string[] }[];
  overlong: {
    max_len: number;
    buffer_len: number;
    penalty_factor: number;
    lengths: number[];
    penalty: number[];
  }[];
};

describe("filterGroups (algorithm.filter_groups)", () => {
  it.each(fx.filter_groups.map((g) => [g.name, g] as const))("%s", (_, g) => {
    const r = filterGroups(g.uids, g.values);
    expect(r.keptUids).toEqual(g.kept);
    expect(r.keep).toEqual(g.uids.map((u) => g.kept.includes(u)));
    expect(r.groups).toBe(new Set(g.uids).size);
    expect(r.dropped).toBe(r.groups - g.kept.length);
  });

  it("drops a group of equal values even where np.std's rounding would keep it (0.1 × 3)", () => {
    expect(filterGroups(["a", "a", "a"], [0.1, 0.1, 0.1]).keptUids).toEqual([]);
  });

  it("refuses values that do not match the uids", () => {
    expect(() => filterGroups(["a", "a"], [1])).toThrow(/uids: 2 values, but the metric has 1/);
  });
});

describe("overlongPenalty (reward.overlong_buffer)", () => {
  it.each(
    fx.overlong.map(
      (o) => [`L_max ${o.max_len}, buffer ${o.buffer_len}, ×${o.penalty_factor}`, o] as const,
    ),
  )("%s", (_, o) => {
    o.lengths.forEach((n, i) => {
      const want = o.penalty[i] as number;
      const got = overlongPenalty(n, o.max_len, o.buffer_len, o.penalty_factor);
      expect(Math.abs(got - want), `length ${n}: ${got} vs ${want}`).toBeLessThanOrEqual(
        1e-15 * Math.abs(want),
      );
    });
  });

  it("refuses a buffer that is not in (0, L_max]", () => {
    expect(() => overlongPenalty(3, 8, 0, 1)).toThrow(/need 0 < len ≤ 8, got 0/);
    expect(() => overlongPenalty(3, 8, 9, 1)).toThrow(/need 0 < len ≤ 8, got 9/);
  });
});
