/** A repository on a Hugging Face-compatible hub, at one revision. */
export interface RepoRef {
  /** "owner/name". */
  id: string;
  type: "model" | "dataset";
  revision: string;
}

/** "owner/name" where both parts are the hub's allowed characters. */
const REPO_ID = /^[A-Za-z0-9][\w.-]*\/[\w.-]+$/;

export function isRepoId(id: string): boolean {
  return REPO_ID.test(id) && !id.includes("..");
}

export function describeRepo(repo: RepoRef): string {
  return `${repo.type} ${repo.id}@${repo.revision}`;
}

function base(endpoint: string): string {
  return endpoint.replace(/\/+$/, "");
}

/** Each path segment escaped, slashes kept, as huggingface_hub's hf_hub_url does. */
function encodePath(filePath: string): string {
  return filePath.split("/").map(encodeURIComponent).join("/");
}

/** The tree API that lists every file of a revision with sizes and hashes. */
export function treeUrl(endpoint: string, repo: RepoRef): string {
  const kind = repo.type === "dataset" ? "datasets" : "models";
  return `${base(endpoint)}/api/${kind}/${repo.id}/tree/${encodeURIComponent(repo.revision)}?recursive=true`;
}

/** Download URL of one file; datasets live under /datasets/, models at the root. */
export function resolveUrl(endpoint: string, repo: RepoRef, filePath: string): string {
  const prefix = repo.type === "dataset" ? "datasets/" : "";
  return `${base(endpoint)}/${prefix}${repo.id}/resolve/${encodeURIComponent(repo.revision)}/${encodePath(filePath)}`;
}
