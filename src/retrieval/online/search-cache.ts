/**
 * The web search cache: one small JSON file per (engine, query, topk), so a repeated query
 * costs nothing (DeepResearcher keeps its search cache 7 days) and a finished run can be
 * replayed without calling the engine. Entries are written whole or not at all (renamed into
 * place), carry the time they were fetched, and are refetched once older than the expiry;
 * a replay reads them whatever their age. Files are spread over 256 subfolders by hash.
 */
import { createHash } from "node:crypto";
import { mkdirSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { writeFileAtomic } from "../../runtime/write-atomic.js";
import type { SearchDocument } from "./provider.js";

interface Entry {
  engine: string;
  query: string;
  topk: number;
  /** When the engine answered (ISO 8601). */
  time: string;
  documents: SearchDocument[];
}

export class SearchCache {
  /**
   * @param root the cache folder (made on the first write)
   * @param maxAgeMs how old an entry may be and still answer; null = any age
   */
  constructor(
    readonly root: string,
    private readonly maxAgeMs: number | null,
  ) {}

  /** The documents recorded for this search; null when there are none, or (unless `anyAge`) too old. */
  async get(
    engine: string,
    query: string,
    topk: number,
    anyAge: boolean,
  ): Promise<SearchDocument[] | null> {
    const text = await readFile(this.path(engine, query, topk), "utf8").catch(() => null);
    if (text === null) return null;
    let entry: Entry;
    try {
      entry = JSON.parse(text) as Entry;
    } catch {
      return null; // damaged: fetched again and overwritten
    }
    // The hash names the file; the entry itself says which search it holds.
    if (entry.engine !== engine || entry.query !== query || entry.topk !== topk) return null;
    if (!Array.isArray(entry.documents)) return null;
    const age = Date.now() - Date.parse(entry.time);
    if (!anyAge && this.maxAgeMs !== null && !(age <= this.maxAgeMs)) return null;
    return entry.documents;
  }

  put(engine: string, query: string, topk: number, documents: SearchDocument[]): void {
    const file = this.path(engine, query, topk);
    mkdirSync(join(file, ".."), { recursive: true });
    const entry: Entry = { engine, query, topk, time: new Date().toISOString(), documents };
    writeFileAtomic(file, `${JSON.stringify(entry)}\n`);
  }

  private path(engine: string, query: string, topk: number): string {
    const hash = createHash("sha256")
      .update(JSON.stringify([engine, query, topk]))
      .digest("hex");
    return join(this.root, engine, hash.slice(0, 2), `${hash}.json`);
  }
}
