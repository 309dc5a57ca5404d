// The manual's links hold: every relative link in README.md and docs/**/*.md points at a file
// or folder that exists, every #anchor (on the same page or `page.md#anchor`) at a heading the
// target has, by GitHub's slugs; and every repository path quoted in backticks (`src/...`,
// `native/src/...`, `test/...`) names something that exists, so a moved file is caught here.
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const ROOT = fileURLToPath(new URL("../", import.meta.url));

function markdownFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (e.isDirectory()) return markdownFiles(path);
    return e.name.endsWith(".md") ? [path] : [];
  });
}

const PAGES = [join(ROOT, "README.md"), ...markdownFiles(join(ROOT, "docs"))];

/** The text outside fenced code blocks, line by line (fenced lines become empty). */
function prose(text: string): string[] {
  let fence: string | undefined;
  return text.split("\n").map((line) => {
    const m = /^\s*(`{3,}|~{3,})/.exec(line);
    if (m) {
      const mark = m[1] as string;
      if (fence === undefined) fence = mark;
      else if (mark.startsWith(fence)) fence = undefined;
      return "";
    }
    return fence === undefined ? line : "";
  });
}

/** A line's text with its code spans' contents kept apart from the rest. */
function spans(line: string): { code: boolean; text: string }[] {
  const out: { code: boolean; text: string }[] = [];
  const re = /(`+)([\s\S]*?[^`])\1(?!`)/g;
  let last = 0;
  for (let m = re.exec(line); m; m = re.exec(line)) {
    out.push({ code: false, text: line.slice(last, m.index) });
    out.push({ code: true, text: (m[2] as string).trim() });
    last = m.index + m[0].length;
  }
  out.push({ code: false, text: line.slice(last) });
  return out;
}

/**
 * GitHub's anchor for a heading (github-slugger on the heading's rendered text): code spans
 * keep their text, links their label, markup goes; then lower case, every character that is
 * not a letter, digit, mark, space, hyphen or underscore dropped, each space a hyphen.
 */
function slug(heading: string): string {
  const text = spans(heading)
    .map((s) =>
      s.code
        ? s.text
        : s.text
            .replace(/!?\[([^\]]*)\]\([^)]*\)/g, "$1")
            .replace(/<[^>]+>/g, "")
            .replace(/[*]/g, ""),
    )
    .join("");
  return text
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, "")
    .replace(/ /g, "-");
}

/** The anchors of a page's headings, with GitHub's -1, -2 ... for repeated ones. */
function anchorsIn(text: string): Set<string> {
  const seen = new Map<string, number>();
  const anchors = new Set<string>();
  for (const line of prose(text)) {
    const m = /^ {0,3}#{1,6}\s+(.*?)(\s+#+)?\s*$/.exec(line);
    if (!m) continue;
    const base = slug(m[1] as string);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

const anchorsOf = (file: string): Set<string> => anchorsIn(readFileSync(file, "utf8"));

/** The link targets of a page outside code: [text](target) and ![alt](target). */
function linksOf(file: string): { line: number; target: string }[] {
  const out: { line: number; target: string }[] = [];
  prose(readFileSync(file, "utf8")).forEach((line, i) => {
    const text = spans(line)
      .filter((s) => !s.code)
      .map((s) => s.text)
      .join("``");
    // A code span may be a link's label ([`src/x.ts`](../src/x.ts)): look at the whole line too.
    for (const source of new Set([text, line])) {
      for (const m of source.matchAll(
        /\]\(([^()\s]+(?:\([^()\s]*\)[^()\s]*)*)(?:\s+"[^"]*")?\)/g,
      )) {
        out.push({ line: i + 1, target: m[1] as string });
      }
    }
  });
  return out.filter(
    (l, i, all) => all.findIndex((o) => o.line === l.line && o.target === l.target) === i,
  );
}

/** Folders of the repository whose paths, quoted in backticks, must exist. */
const QUOTED = /^(src|native\/src|test|bench|templates|cli|commands)\/[\w./-]*$/;

function quotedPathsOf(file: string): { line: number; path: string }[] {
  const out: { line: number; path: string }[] = [];
  prose(readFileSync(file, "utf8")).forEach((line, i) => {
    for (const s of spans(line)) {
      if (s.code && QUOTED.test(s.text)) out.push({ line: i + 1, path: s.text });
    }
  });
  return out;
}

/** What is wrong with a page's links, one line each (file:line: ...). */
function problems(file: string): string[] {
  const name = relative(ROOT, file);
  const found: string[] = [];
  for (const { line, target } of linksOf(file)) {
    if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:
    const hash = target.indexOf("#");
    const path = decodeURI(hash < 0 ? target : target.slice(0, hash));
    const anchor = hash < 0 ? undefined : decodeURIComponent(target.slice(hash + 1));
    const dest = path === "" ? file : resolve(dirname(file), path);
    if (!existsSync(dest)) {
      found.push(`${name}:${line}: ${target}: no such file`);
      continue;
    }
    if (anchor === undefined) continue;
    if (statSync(dest).isDirectory() || !dest.endsWith(".md")) {
      found.push(`${name}:${line}: ${target}: an anchor into a file that is not Markdown`);
    } else if (!anchorsOf(dest).has(anchor)) {
      found.push(`${name}:${line}: ${target}: ${relative(ROOT, dest)} has no heading #${anchor}`);
    }
  }
  for (const { line, path } of quotedPathsOf(file)) {
    if (!existsSync(join(ROOT, path))) found.push(`${name}:${line}: \`${path}\`: no such path`);
  }
  return found;
}

describe("the manual's links", () => {
  it("finds the pages", () => {
    expect(PAGES.map((p) => relative(ROOT, p))).toEqual(
      expect.arrayContaining(["README.md", "docs/commands/train.md", "docs/architecture.md"]),
    );
  });

  it.each(PAGES.map((p) => [relative(ROOT, p), p]))(
    "%s: relative links, anchors and quoted paths resolve",
    (_name, file) => {
      expect(problems(file)).toEqual([]);
    },
  );

  it("slugs headings as GitHub does", () => {
    expect(slug("`searchr1 download`")).toBe("searchr1-download");
    expect(slug("Experiment tracking (`trainer.logger`)")).toBe(
      "experiment-tracking-trainerlogger",
    );
    expect(slug("Dense indexes: `--retriever e5` (or `bge`)")).toBe(
      "dense-indexes---retriever-e5-or-bge",
    );
    expect(slug("ZeRO: the learners' state sharded over the ranks")).toBe(
      "zero-the-learners-state-sharded-over-the-ranks",
    );
    expect(slug("Native trainer: `searchr1-trainer`")).toBe("native-trainer-searchr1-trainer");
    expect(slug("Memory per device — **8 × 80 GB**")).toBe("memory-per-device--8--80-gb");
    expect(slug("`trainer.log_every` [link](x.md)")).toBe("trainerlog_every-link");
  });

  it("numbers repeated headings -1, -2 as GitHub does, and skips code blocks", () => {
    const text = "# Notes\n## Notes\n```\n# not a heading\n```\n### Notes ###\n";
    expect([...anchorsIn(text)]).toEqual(["notes", "notes-1", "notes-2"]);
  });
});
