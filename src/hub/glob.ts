/**
 * fnmatch-style patterns as huggingface_hub's allow_patterns use them: `*` also crosses `/`,
 * `?` is one character, `[...]` a class, and a trailing `/` means everything in that folder.
 */
export function globToRegExp(pattern: string): RegExp {
  const p = pattern.endsWith("/") ? `${pattern}*` : pattern;
  let re = "";
  for (let i = 0; i < p.length; i++) {
    const c = p.charAt(i);
    if (c === "*") re += ".*";
    else if (c === "?") re += ".";
    else if (c === "[") {
      const close = p.indexOf("]", i + 2);
      if (close === -1) re += "\\[";
      else {
        const body = p.slice(i + 1, close);
        re += `[${body.startsWith("!") ? `^${body.slice(1)}` : body.replace(/\\/g, "\\\\")}]`;
        i = close;
      }
    } else re += c.replace(/[.+^${}()|\\]/g, "\\$&");
  }
  return new RegExp(`^${re}$`);
}

export function matchesAny(filePath: string, patterns: string[]): boolean {
  return patterns.some((p) => globToRegExp(p).test(filePath));
}
