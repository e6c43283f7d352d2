/**
 * The WebSocket transport of runs (docs/protocol.md §13): `GET /api/runs/ws`
 * carries a run's lines as text messages, one line each. A socket is shown
 * to the rest of the SDK as the NDJSON `Response` the HTTP transport gets
 * (the lines, each ended by `\n`), so resume, client tools, encryption and
 * cancel work the same; tool results and `cancel` go over the socket while
 * it is open.
 *
 * Node 20 has no global WebSocket: the `ws` package is used when it can be
 * loaded (it also sends the API key as `Authorization`); otherwise the
 * platform's `WebSocket` (a browser, which sends its session cookie).
 */

import { AsbxError } from "./errors.js";

/** How a run's stream travels: NDJSON over HTTP (default) or a WebSocket. */
export type Transport = "http" | "websocket";

/** The WHATWG WebSocket surface used here (the `ws` package has it too). */
interface SocketLike {
  readonly readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  addEventListener(type: string, listener: (event: any) => void): void;
}

type SocketCtor = new (url: string, options?: unknown) => SocketLike;

let ctor: Promise<{ Ctor: SocketCtor; headers: boolean }> | undefined;

/** The `ws` package when it loads (headers allowed), else the global WebSocket. */
function socketClass(): Promise<{ Ctor: SocketCtor; headers: boolean }> {
  ctor ??= (async () => {
    const name = "ws";
    try {
      const mod: any = await import(name);
      const Ctor = (mod.WebSocket ?? mod.default) as SocketCtor | undefined;
      if (Ctor) return { Ctor, headers: true };
    } catch {
      // Not installed (a browser bundle): the platform's below.
    }
    const Global = (globalThis as any).WebSocket as SocketCtor | undefined;
    if (!Global) {
      throw new AsbxError({
        status: 0,
        code: "protocol_error",
        detail: "transport websocket needs the `ws` package or a global WebSocket",
      });
    }
    return { Ctor: Global, headers: false };
  })();
  return ctor;
}

/** One socket carrying one run. */
export class RunSocket {
  /** The run's lines as an NDJSON `Response` (`x-asbx-run-id` from the first line), once the first line came; rejects with the server's refusal. */
  readonly response: Promise<Response>;
  /** The last refusal of a message sent on an open socket (an `error` line with `seq` 0). */
  refusal: { code: string; message: string } | undefined;
  #socket: SocketLike | undefined;
  #open = false;

  private constructor(response: Promise<Response>) {
    this.response = response;
  }

  /**
   * Opens `{baseUrl}/api/runs/ws` and sends `message` (`dispatch` or
   * `attach`). `runId` names the run already known (an attach).
   */
  static open(
    baseUrl: string,
    headers: Record<string, string>,
    message: Record<string, unknown>,
    runId: string | undefined,
    signal?: AbortSignal,
  ): RunSocket {
    let resolve!: (r: Response) => void;
    let reject!: (e: unknown) => void;
    const response = new Promise<Response>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    response.catch(() => {});
    const self = new RunSocket(response);
    void self.#connect(baseUrl, headers, message, runId, signal, resolve, reject);
    return self;
  }

  async #connect(
    baseUrl: string,
    headers: Record<string, string>,
    message: Record<string, unknown>,
    runId: string | undefined,
    signal: AbortSignal | undefined,
    resolve: (r: Response) => void,
    reject: (e: unknown) => void,
  ): Promise<void> {
    let Ctor: SocketCtor;
    let withHeaders: boolean;
    try {
      ({ Ctor, headers: withHeaders } = await socketClass());
    } catch (e) {
      reject(e);
      return;
    }
    const url = `${baseUrl.replace(/^http/, "ws")}/api/runs/ws`;
    const socket = withHeaders ? new Ctor(url, { headers }) : new Ctor(url);
    this.#socket = socket;
    const encoder = new TextEncoder();
    let controller!: ReadableStreamDefaultController<Uint8Array>;
    // Set once the body is closed, errored or cancelled by its reader:
    // a socket's later messages and its close then have nowhere to go.
    let ended = false;
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        controller = c;
      },
      cancel() {
        ended = true;
        socket.close(1000);
      },
    });
    const end = (error?: AsbxError) => {
      if (ended) return;
      ended = true;
      if (error) controller.error(error);
      else controller.close();
    };
    let started = false;
    let refused: AsbxError | undefined;
    let httpStatus: number | undefined;
    const start = (id: string | undefined) => {
      started = true;
      const h: Record<string, string> = { "content-type": "application/x-ndjson" };
      if (id) h["x-asbx-run-id"] = id;
      resolve(new Response(body, { status: 200, headers: h }));
    };
    // The `ws` package hands over a refused upgrade's answer (then it is
    // ours to end): its problem+json says why.
    (socket as any).on?.("unexpected-response", (req: any, res: any) => {
      httpStatus = res.statusCode;
      const chunks: Uint8Array[] = [];
      res.on("data", (c: Uint8Array) => chunks.push(c));
      res.on("end", () => {
        let problem: Record<string, unknown> = {};
        try {
          const decoder = new TextDecoder();
          problem = JSON.parse(chunks.map((c) => decoder.decode(c, { stream: true })).join("") + decoder.decode());
        } catch {
          // Not a problem body: the status says enough.
        }
        reject(
          new AsbxError({
            status: httpStatus ?? 0,
            code: typeof problem.code === "string" ? problem.code : "http_error",
            detail: typeof problem.detail === "string" ? problem.detail : `the upgrade was refused (${httpStatus})`,
            problem,
          }),
        );
        req.destroy?.();
      });
    });
    signal?.addEventListener("abort", () => socket.close(1000), { once: true });
    socket.addEventListener("open", () => {
      this.#open = true;
      socket.send(JSON.stringify(message));
    });
    socket.addEventListener("message", (ev: { data: unknown }) => {
      if (typeof ev.data !== "string") return;
      const text = ev.data;
      let line: { seq?: unknown; type?: unknown; code?: unknown; message?: unknown; sessionId?: unknown };
      try {
        line = JSON.parse(text);
      } catch {
        return;
      }
      if (line.seq === 0 && line.type === "error") {
        const code = String(line.code ?? "protocol_error");
        const detail = String(line.message ?? "");
        if (!started) refused = new AsbxError({ status: 0, code, detail });
        else this.refusal = { code, message: detail };
        return;
      }
      if (!started) start(runId ?? (typeof line.sessionId === "string" ? line.sessionId : undefined));
      if (!ended) controller.enqueue(encoder.encode(`${text}\n`));
    });
    socket.addEventListener("error", () => {});
    socket.addEventListener("close", (ev: { code?: number; reason?: string }) => {
      this.#open = false;
      if (!started) {
        if (ev.code === 1000) {
          // The run had nothing more after `after`.
          start(runId);
          end();
          return;
        }
        reject(
          refused ??
            new AsbxError({
              status: httpStatus ?? 0,
              code: httpStatus === 401 ? "unauthorized" : "connection_lost",
              detail: `the socket closed (${ev.code ?? "no code"}${httpStatus ? `, HTTP ${httpStatus}` : ""})`,
            }),
        );
        return;
      }
      if (ev.code === 1000) {
        end();
      } else {
        end(new AsbxError({ status: 0, code: "connection_lost", detail: `the socket closed (${ev.code ?? "no code"})` }));
      }
    });
  }

  /** Sends a message while the socket is open; `false` when it is not. */
  send(message: Record<string, unknown>): boolean {
    if (!this.#open || !this.#socket) return false;
    this.#socket.send(JSON.stringify(message));
    return true;
  }

  close(): void {
    this.#socket?.close(1000);
  }
}
