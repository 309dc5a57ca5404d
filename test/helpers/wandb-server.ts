// A stand-in for a W&B server (api.wandb.ai, or a W&B server of one's own), which cannot run
// here: it answers the requests src/tracking/wandb.ts makes, as W&B's API does, and records
// every one. POST /graphql: the `viewer` query, the `upsertBucket` and `createRunFiles`
// mutations; POST /files/<entity>/<project>/<run>/file_stream; PUT /upload/<file> (the
// upload URLs createRunFiles hands out, with an extra header to send along).
import http from "node:http";
import type { AddressInfo } from "node:net";

export interface GraphQlCall {
  query: string;
  variables: Record<string, unknown>;
  authorization: string | undefined;
}

export interface FileStreamPost {
  path: string;
  authorization: string | undefined;
  body: {
    files?: Record<string, { offset: number; content: string[] }>;
    uploaded?: string[];
    complete?: boolean;
    exitcode?: number;
  };
}

export interface WandbStandIn {
  url: string;
  graphql: GraphQlCall[];
  /** The file_stream posts the server took (a refused one is not here). */
  fileStream: FileStreamPost[];
  /** Uploaded files by name, and the stand-in header each came with. */
  uploads: Map<string, { bytes: Buffer; header: string | undefined }>;
  /** Answer the next n file_stream posts with 500 (a server having a bad moment). */
  failFileStream(n: number): void;
  /** The history lines taken, in offset order, parsed. */
  history(): Record<string, unknown>[];
  close(): Promise<void>;
}

/** `apiKey`: the only key accepted (any other gets 401); `entity`: the key's user. */
export async function startWandbStandIn(
  options: { apiKey?: string; entity?: string; historyLineCount?: number } = {},
): Promise<WandbStandIn> {
  const entity = options.entity ?? "tester";
  let failures = 0;
  const standIn: WandbStandIn = {
    url: "",
    graphql: [],
    fileStream: [],
    uploads: new Map(),
    failFileStream(n) {
      failures = n;
    },
    history() {
      const lines: [number, Record<string, unknown>][] = [];
      for (const post of standIn.fileStream) {
        const h = post.body.files?.["wandb-history.jsonl"];
        h?.content.forEach((l, i) => {
          lines.push([h.offset + i, JSON.parse(l)]);
        });
      }
      return lines.sort((a, b) => a[0] - b[0]).map(([, l]) => l);
    },
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
  const authorized = (h: string | undefined) =>
    options.apiKey === undefined ||
    h === `Basic ${Buffer.from(`api:${options.apiKey}`).toString("base64")}`;
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      const json = (status: number, value: unknown) => {
        res.writeHead(status, { "content-type": "application/json" });
        res.end(JSON.stringify(value));
      };
      const auth = req.headers.authorization;
      const url = req.url ?? "";
      if (req.method === "PUT" && url.startsWith("/upload/")) {
        const name = decodeURIComponent(url.slice("/upload/".length));
        standIn.uploads.set(name, {
          bytes: body,
          header: req.headers["x-stand-in"] as string | undefined,
        });
        res.writeHead(200).end();
        return;
      }
      if (!authorized(auth)) {
        json(401, { errors: [{ message: "user is not logged in" }] });
        return;
      }
      if (req.method === "POST" && url === "/graphql") {
        const { query, variables } = JSON.parse(body.toString("utf8"));
        standIn.graphql.push({ query, variables, authorization: auth });
        if (/\bupsertBucket\b/.test(query)) {
          json(200, {
            data: {
              upsertBucket: {
                bucket: {
                  id: "UnVuOnYxOnN0YW5kLWlu",
                  name: variables.name,
                  displayName: variables.displayName,
                  historyLineCount: options.historyLineCount ?? 0,
                  project: { name: variables.project, entity: { name: variables.entity } },
                },
                inserted: true,
              },
            },
          });
        } else if (/\bcreateRunFiles\b/.test(query)) {
          json(200, {
            data: {
              createRunFiles: {
                runID: "UnVuOnYxOnN0YW5kLWlu",
                uploadHeaders: ["X-Stand-In: yes"],
                files: (variables.files as string[]).map((name) => ({
                  name,
                  uploadUrl: `${standIn.url}/upload/${encodeURIComponent(name)}`,
                })),
              },
            },
          });
        } else if (/\bviewer\b/.test(query)) {
          json(200, { data: { viewer: { id: "VXNlcjox", entity } } });
        } else {
          json(200, { errors: [{ message: "unknown operation" }] });
        }
        return;
      }
      if (req.method === "POST" && /^\/files\/[^/]+\/[^/]+\/[^/]+\/file_stream$/.test(url)) {
        if (failures > 0) {
          failures--;
          json(500, { error: "try again" });
          return;
        }
        standIn.fileStream.push({
          path: url,
          authorization: auth,
          body: JSON.parse(body.toString()),
        });
        json(200, { exitcode: null, limits: {} });
        return;
      }
      json(404, { error: `no ${req.method} ${url}` });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  standIn.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return standIn;
}
