import { UsageError } from "../runtime/errors.js";
import type { RemoteFile } from "./client.js";
import { matchesAny } from "./glob.js";
import { isRepoId } from "./repo.js";

/** One thing to fetch: files of a repository, where they go, and what to make of them. */
export interface Artifact {
  /** As the user named it: "e5-flat", "flashrag:nq", "model:Qwen/Qwen2.5-3B", "repo:owner/name". */
  name: string;
  repoId: string;
  repoType: "model" | "dataset";
  /** fnmatch patterns of the repository paths to take. */
  include: string[];
  exclude: string[];
  /** Folder under --save-path the files go to, keeping their repository paths. */
  dir: string;
  /** Concatenate the selected files in path order into this file (relative to --save-path). */
  join?: string;
  /** Expand `.gz` files (not `.tar.gz`) next to themselves. */
  gunzip?: boolean;
  /** Extract `.tar`, `.tar.gz` and `.tgz` files into their folder. */
  untar?: boolean;
  /** A problem with the selected files that makes the artifact unusable, or undefined. */
  check?: (files: RemoteFile[]) => string | undefined;
}

/**
 * The files a model needs to be loaded: config, safetensors weights, tokenizer (vocab.txt:
 * BERT-family retrievers without tokenizer.json), generation.
 */
const MODEL_FILES = [
  "config.json",
  "generation_config.json",
  "*.safetensors",
  "*.safetensors.index.json",
  "tokenizer.json",
  "tokenizer_config.json",
  "tokenizer.model",
  "vocab.json",
  "merges.txt",
  "vocab.txt",
  "special_tokens_map.json",
  "added_tokens.json",
];

/**
 * Search-R1's artefacts (Search-R1 scripts/download.py, docs/retriever.md and README.md
 * "Quick start"), with the manual steps of its README done.
 */
const NAMED: Record<string, Omit<Artifact, "name">> = {
  "e5-flat": {
    repoId: "PeterJinGo/wiki-18-e5-index",
    repoType: "dataset",
    include: ["part_*"],
    exclude: [],
    dir: "",
    join: "e5_Flat.index",
  },
  corpus: {
    repoId: "PeterJinGo/wiki-18-corpus",
    repoType: "dataset",
    include: ["wiki-18.jsonl.gz"],
    exclude: [],
    dir: "",
    gunzip: true,
  },
  bm25: {
    repoId: "PeterJinGo/wiki-18-bm25-index",
    repoType: "dataset",
    include: ["*"],
    exclude: [".gitattributes"],
    dir: "",
    untar: true,
  },
  "e5-hnsw": {
    repoId: "PeterJinGo/wiki-18-e5-index-HNSW64",
    repoType: "dataset",
    include: ["part_*"],
    exclude: [],
    // Its parts are named like the flat index's, so they wait in their own folder.
    dir: "e5_HNSW64.parts",
    join: "e5_HNSW64.index",
  },
  "nq-hotpotqa": {
    repoId: "PeterJinGo/nq_hotpotqa_train",
    repoType: "dataset",
    include: ["*"],
    exclude: [".gitattributes"],
    dir: "nq_hotpotqa_train",
    untar: true,
  },
};

export const NAMED_SELECTIONS = Object.keys(NAMED);

/** What `searchr1 download --save-path DIR` fetches: what Search-R1's download.py fetches. */
export const DEFAULT_SELECTION = ["e5-flat", "corpus"];

export const FLASHRAG_REPO = "RUC-NLPIR/FlashRAG_datasets";

function flashrag(dataset: string): Artifact {
  return {
    name: `flashrag:${dataset}`,
    repoId: FLASHRAG_REPO,
    repoType: "dataset",
    include: [`${dataset}/*`],
    exclude: [],
    // The folder `preprocess --input` reads.
    dir: "FlashRAG_datasets",
  };
}

function model(repoId: string): Artifact {
  return {
    name: `model:${repoId}`,
    repoId,
    repoType: "model",
    include: MODEL_FILES,
    exclude: [],
    dir: repoId.slice(repoId.indexOf("/") + 1),
    check: (files) =>
      files.some((f) => f.path.endsWith(".safetensors"))
        ? undefined
        : "the repository has no .safetensors weights (searchr1 reads safetensors only)",
  };
}

export interface SelectionOptions {
  what: string[];
  repo: string | null;
  repoType: "model" | "dataset";
  include: string[];
}

/**
 * Reads `--what` and `--repo`. `--what flashrag:nq,hotpotqa` arrives split at the comma, so a
 * bare word after a `flashrag:` item is one more FlashRAG dataset.
 */
export function parseSelections(opts: SelectionOptions): Artifact[] {
  const what = opts.what.length === 0 && !opts.repo ? DEFAULT_SELECTION : opts.what;
  const artifacts: Artifact[] = [];
  let inFlashrag = false;
  for (const raw of what) {
    const item = raw.trim();
    const named = NAMED[item];
    if (named) {
      artifacts.push({ name: item, ...named });
      inFlashrag = false;
    } else if (item.startsWith("flashrag:")) {
      artifacts.push(flashrag(item.slice("flashrag:".length)));
      inFlashrag = true;
    } else if (item.startsWith("model:")) {
      const id = item.slice("model:".length);
      if (!isRepoId(id)) throw new UsageError(`--what ${item}: expected model:OWNER/NAME`);
      artifacts.push(model(id));
      inFlashrag = false;
    } else if (inFlashrag && /^[\w.-]+$/.test(item)) {
      artifacts.push(flashrag(item));
    } else {
      throw new UsageError(
        `--what: unknown selection "${item}"; expected one of ${NAMED_SELECTIONS.join(", ")}, flashrag:<dataset>[,<dataset>...], model:<owner/name>`,
      );
    }
  }
  if (opts.repo) {
    if (!isRepoId(opts.repo)) throw new UsageError(`--repo ${opts.repo}: expected OWNER/NAME`);
    artifacts.push({
      name: `repo:${opts.repo}`,
      repoId: opts.repo,
      repoType: opts.repoType,
      include: opts.include.length > 0 ? opts.include : ["*"],
      exclude: [],
      dir: "",
    });
  } else if (opts.include.length > 0) {
    throw new UsageError("--include applies to --repo; name the repository with --repo OWNER/NAME");
  }
  return artifacts;
}

/** The artifact's files among a repository listing, or an error saying why there are none. */
export function selectFiles(artifact: Artifact, listing: RemoteFile[]): RemoteFile[] {
  const files = listing
    .filter((f) => matchesAny(f.path, artifact.include) && !matchesAny(f.path, artifact.exclude))
    .sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  if (files.length === 0) {
    const top = [...new Set(listing.map((f) => f.path.split("/")[0]))].slice(0, 30);
    throw new UsageError(
      `${artifact.name}: nothing in ${artifact.repoType} ${artifact.repoId} matches ${artifact.include.join(", ")} (it has: ${top.join(", ") || "no files"})`,
    );
  }
  const problem = artifact.check?.(files);
  if (problem) throw new UsageError(`${artifact.name}: ${problem}`);
  return files;
}
