/**
 * Stand-ins for the web search engines on the loopback (there is no network here): one
 * HTTP server that records each request, counts how many are in flight, and answers as the
 * test says, and the answers each engine gives, in its documented format: SerpAPI's
 * `answer_box`/`organic_results`/`related_questions`, Serper's `answerBox`/`organic`/
 * `peopleAlsoAsk`, Google Custom Search's `items`.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";

export interface SeenRequest {
  method: string;
  url: URL;
  headers: http.IncomingHttpHeaders;
  /** The parsed JSON body; undefined for a GET. */
  body: unknown;
}

/** An answer: status and JSON body (after `delayMs`), or "hang": never answered. */
export type StandInReply = { status: number; body: unknown; delayMs?: number } | "hang";

export class SearchStandIn {
  readonly requests: SeenRequest[] = [];
  /** Requests being answered now, and the most at once. */
  active = 0;
  maxActive = 0;

  private constructor(
    private readonly server: http.Server,
    public reply: (req: SeenRequest) => StandInReply,
  ) {}

  /** Listens on 127.0.0.1 at a free port; `reply` may be changed later. */
  static async start(reply: (req: SeenRequest) => StandInReply): Promise<SearchStandIn> {
    let standIn: SearchStandIn | undefined;
    const server = http.createServer((req, res) => standIn?.answer(req, res));
    standIn = new SearchStandIn(server, reply);
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return standIn;
  }

  /** The endpoint to give as --search-url. */
  get url(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/search`;
  }

  /** The queries asked, in order: `q` of the query string or of the JSON body. */
  get queries(): string[] {
    return this.requests.map(
      (r) => r.url.searchParams.get("q") ?? ((r.body as { q?: string })?.q as string),
    );
  }

  close(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }

  private answer(req: http.IncomingMessage, res: http.ServerResponse): void {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      const seen: SeenRequest = {
        method: req.method ?? "",
        url: new URL(req.url ?? "/", "http://127.0.0.1"),
        headers: req.headers,
        body: text ? JSON.parse(text) : undefined,
      };
      this.requests.push(seen);
      this.active++;
      this.maxActive = Math.max(this.maxActive, this.active);
      const reply = this.reply(seen);
      if (reply === "hang") return;
      setTimeout(() => {
        this.active--;
        const body = JSON.stringify(reply.body);
        res.writeHead(reply.status, { "Content-Type": "application/json" });
        res.end(body);
      }, reply.delayMs ?? 0);
    });
  }
}

const link = (q: string, section: string, i: number) =>
  `https://example.org/${encodeURIComponent(q)}/${section}/${i}`;

/** SerpAPI's answer: an answer box, `organic` organic results, `related` related questions. */
export function serpapiAnswer(q: string, organic = 5, related = 3): unknown {
  return {
    search_metadata: { status: "Success" },
    answer_box: {
      title: `Answer to ${q}`,
      snippet: `the answer box of ${q}`,
      link: link(q, "box", 0),
    },
    organic_results: Array.from({ length: organic }, (_, i) => ({
      position: i + 1,
      title: `${q} result ${i}`,
      snippet: `snippet ${i} of ${q}`,
      link: link(q, "organic", i),
    })),
    related_questions: Array.from({ length: related }, (_, i) => ({
      question: `related question ${i} about ${q}?`,
      snippet: `related snippet ${i}`,
      link: link(q, "related", i),
    })),
  };
}

/** Serper's answer: the same sections under Serper's names. */
export function serperAnswer(q: string, organic = 5, related = 3): unknown {
  return {
    searchParameters: { q, type: "search", engine: "google" },
    answerBox: {
      title: `Answer to ${q}`,
      snippet: `the answer box of ${q}`,
      link: link(q, "box", 0),
    },
    organic: Array.from({ length: organic }, (_, i) => ({
      title: `${q} result ${i}`,
      link: link(q, "organic", i),
      snippet: `snippet ${i} of ${q}`,
      position: i + 1,
    })),
    peopleAlsoAsk: Array.from({ length: related }, (_, i) => ({
      question: `related question ${i} about ${q}?`,
      snippet: `related snippet ${i}`,
      title: `a page ${i}`,
      link: link(q, "related", i),
    })),
  };
}

/** Google Custom Search's answer: `items` with title, link and snippet. */
export function googleAnswer(q: string, items: { title: string; snippet: string }[]): unknown {
  return {
    kind: "customsearch#search",
    queries: { request: [{ searchTerms: q }] },
    items: items.map((item, i) => ({
      kind: "customsearch#result",
      ...item,
      link: link(q, "item", i),
    })),
  };
}
