/**
 * A run (protocol 2, docs/protocol.md §4 and §7) as an async iterator of
 * typed events: resumed after a dropped connection, client tools answered
 * by callbacks, decrypted when encrypted, cancelled with an `AbortSignal`.
 */

import { AbortLink } from "./abort.js";
import type { Connection } from "./connection.js";
import { ClientKeyPair, type Sealed, type SessionCipher } from "./crypto.js";
import { AsbxError } from "./errors.js";
import { delayOf, resumable, type Frame } from "./resume.js";
import { ndjsonLines } from "./streams.js";
import { RunSocket, type Transport } from "./ws.js";
import type {
  ClientToolSpec,
  CreateRunBody,
  RunEvent,
  RunInfo,
  SessionInitEvent,
  TerminationInfo,
  ToolCallEvent,
} from "./types.js";

/** A client tool's answer: a JSON result, or an error message. */
export type ToolAnswer = { result: unknown } | { error: string };

/** Runs a client tool; what it returns is the result, what it throws the error. */
export type ToolHandler = (args: any, call: ToolCallEvent) => unknown | Promise<unknown>;

/** A client tool the SDK answers itself. */
export interface ClientTool {
  description?: string;
  /** JSON Schema of the arguments. */
  parameters?: unknown;
  handler: ToolHandler;
}

export interface CreateRunOptions extends CreateRunBody {
  /** Client tools answered by callbacks, by name. */
  tools?: Record<string, ClientTool>;
  /** Client tools the caller answers itself with `run.respond`. */
  clientTools?: ClientToolSpec[];
  /** End-to-end encryption (docs/protocol.md §4): the workspace sees only ciphertext. */
  encrypt?: boolean;
  /** Start the run of a stored agent (`POST /api/agents/{id}/runs`). */
  agentId?: string;
  /** Aborting it cancels the run (`DELETE /api/runs/{id}`) and ends the iteration. */
  signal?: AbortSignal;
  /** `"websocket"`: stream over `GET /api/runs/ws` (default: the client's `transport`). */
  transport?: Transport;
}

export class Run implements AsyncIterable<RunEvent> {
  /** The run id (`x-asbx-run-id`), once the server answered. */
  id: string | undefined;
  /** Resolves to the run id when the server accepts the run; rejects with its error. */
  readonly ready: Promise<string>;
  /** `session_init`, once seen. */
  init: SessionInitEvent | undefined;
  /** How the session ended (`session_ended`), once seen. */
  termination: TerminationInfo | undefined;
  /** The `result` message, once seen. */
  result: string | undefined;
  /** The `error` line, once seen. */
  error: { code: string; message: string } | undefined;

  readonly #client: Connection;
  readonly #tools: Record<string, ClientTool>;
  readonly #keys: Promise<ClientKeyPair> | undefined;
  #cipher: SessionCipher | undefined;
  readonly #link: AbortLink;
  #iterator: AsyncGenerator<RunEvent> | undefined;
  readonly #first: Promise<Response>;
  #toolFailure: unknown;
  #observed = 0;
  /** Lines at or below this are read but not yielded (an attach after N). */
  readonly #skipUpTo: number;
  /** The socket carrying the run (transport `websocket`). */
  #socket: RunSocket | undefined;
  #transport: Transport = "http";

  private constructor(
    client: Connection,
    tools: Record<string, ClientTool>,
    keys: Promise<ClientKeyPair> | undefined,
    signal: AbortSignal | undefined,
    open: (self: Run, link: AbortLink) => Promise<Response>,
    skipUpTo: number,
  ) {
    this.#client = client;
    this.#tools = tools;
    this.#keys = keys;
    this.#skipUpTo = skipUpTo;
    this.#link = new AbortLink(signal, () => this.#onAbort());
    this.#first = open(this, this.#link);
    this.ready = this.#first.then(() => this.id as string);
    this.ready.catch(() => {});
  }

  /** @internal */
  static create(client: Connection, options: CreateRunOptions): Run {
    const { tools = {}, clientTools = [], encrypt, agentId, signal, transport, ...body } = options;
    const viaSocket = (transport ?? client.transport) === "websocket";
    if (viaSocket && agentId) throw new TypeError("transport websocket runs POST /api/runs bodies, not agentId");
    const keys = encrypt ? ClientKeyPair.generate() : undefined;
    const specs: ClientToolSpec[] = [
      ...clientTools,
      ...Object.entries(tools).map(([name, t]) => ({
        name,
        description: t.description ?? name,
        parameters: t.parameters ?? { type: "object", properties: {} },
      })),
    ];
    const path = agentId ? `/api/agents/${encodeURIComponent(agentId)}/runs` : "/api/runs";
    return new Run(client, tools, keys, signal, async (self, link) => {
      const json: Record<string, unknown> = { ...body, protocol: 2 };
      if (specs.length) json.clientTools = specs;
      if (keys) json.encryption = { clientPublicKey: (await keys).publicKey };
      if (viaSocket) {
        self.#transport = "websocket";
        self.#socket = RunSocket.open(client.baseUrl, client.socketHeaders(), { type: "dispatch", ...json }, undefined, link.controller.signal);
        const res = await self.#socket.response;
        self.id = res.headers.get("x-asbx-run-id") ?? undefined;
        if (!self.id) throw new AsbxError({ status: 0, code: "protocol_error", detail: "no line names the run" });
        return res;
      }
      // The POST is not tied to the signal until its headers arrive, so an
      // abort still learns the run id and cancels the run.
      const res = await client.request("POST", path, {
        json,
        accept: "application/x-ndjson",
        signal: link.controller.signal,
      });
      self.id = res.headers.get("x-asbx-run-id") ?? undefined;
      if (!self.id) {
        throw new AsbxError({ status: 0, code: "protocol_error", detail: "no x-asbx-run-id header" });
      }
      return res;
    }, 0);
  }

  /** @internal */
  static attach(client: Connection, id: string, after: number, signal?: AbortSignal, transport?: Transport): Run {
    return new Run(client, {}, undefined, signal, async (self, link) => {
      self.id = id;
      if ((transport ?? client.transport) === "websocket") {
        self.#transport = "websocket";
        return self.#attachSocket(after);
      }
      return client.request("GET", `/api/runs/${encodeURIComponent(id)}/events?after=${after}`, {
        accept: "application/x-ndjson",
        signal: link.controller.signal,
      });
    }, after);
  }

  [Symbol.asyncIterator](): AsyncGenerator<RunEvent> {
    if (this.#iterator) throw new TypeError("a Run is iterated once");
    this.#iterator = this.#events();
    return this.#iterator;
  }

  /** Reads the run to its end; resolves to its termination. */
  async finished(): Promise<TerminationInfo | undefined> {
    for await (const _ of this) void _;
    return this.termination;
  }

  /** Answers a client tool call (sealed when the run is encrypted). */
  async respond(callId: string, answer: ToolAnswer): Promise<void> {
    const id = await this.ready;
    let json: { callId: string; encrypted?: Sealed } & Partial<ToolAnswer> = { callId, ...answer };
    if (this.#keys) {
      if (!this.#cipher) {
        throw new AsbxError({ status: 0, code: "protocol_error", detail: "no session key before session_init" });
      }
      json = { callId, encrypted: await this.#cipher.sealToolResult(callId, answer) };
    }
    if (this.#socket?.send({ type: "tool_result", ...json })) return;
    await this.#client.request("POST", `/api/runs/${encodeURIComponent(id)}/tool-result`, { json });
  }

  /** Cancels the run (`DELETE /api/runs/{id}`); the iteration goes on to `session_ended`. */
  async cancel(): Promise<void> {
    const id = await this.ready;
    if (this.#socket?.send({ type: "cancel" })) return;
    await this.#client.runs.cancel(id);
  }

  /** Opens a socket attached to this run after `after` (transport `websocket`). */
  #attachSocket(after: number): Promise<Response> {
    this.#socket?.close();
    this.#socket = RunSocket.open(
      this.#client.baseUrl,
      this.#client.socketHeaders(),
      { type: "attach", runId: this.id, after },
      this.id,
      this.#link.controller.signal,
    );
    return this.#socket.response;
  }

  /** `GET /api/runs/{id}`. */
  async info(): Promise<RunInfo> {
    return this.#client.runs.get(await this.ready);
  }

  #onAbort(): void {
    // Once the run has an id, end the stream and cancel the run; the POST
    // stays open until then so the id is known.
    this.#first.then(
      () => {
        this.#link.controller.abort(this.#link.aborted()?.reason);
        if (this.id) this.#client.runs.cancel(this.id).catch(() => {});
      },
      () => {},
    );
  }

  #events(): AsyncGenerator<RunEvent> {
    let finalReplay = false;
    let settled: RunInfo | undefined;
    return resumable<RunEvent>({
      first: this.#first,
      retry: this.#client.retry,
      abortWait: this.#link.wait,
      aborted: () => this.#link.aborted(),
      frames: (res) => this.#frames(res),
      reopen: async (after) => {
        // Lines of an encrypted run need session_init's key: replay from 0.
        const from = this.#keys && !this.#cipher ? 0 : after;
        if (this.#transport === "websocket") return this.#attachSocket(from);
        return this.#client.request("GET", `/api/runs/${encodeURIComponent(this.id!)}/events?after=${from}`, {
          accept: "application/x-ndjson",
          signal: this.#link.controller.signal,
          retries: 0,
        });
      },
      stopAfterCleanEnd: async () => {
        // The stream ended without session_ended: once the run is settled,
        // one last replay picks up what is stored, then it is over.
        if (finalReplay) {
          // Settled without session_ended (e.g. runner_lost): the run
          // record says how it ended.
          if (!this.termination && settled?.termination) this.termination = settled.termination;
          if (!this.error && settled?.error) this.error = settled.error;
          return true;
        }
        const info = await this.#client.runs.get(this.id!);
        if (info.status !== "running") {
          finalReplay = true;
          settled = info;
        }
        return false;
      },
    });
  }

  async *#frames(res: Response): AsyncGenerator<Frame<RunEvent>> {
    if (!res.body) return;
    for await (const text of ndjsonLines(res.body)) {
      if (this.#toolFailure) throw this.#toolFailure;
      let raw: Record<string, unknown>;
      try {
        raw = JSON.parse(text) as Record<string, unknown>;
      } catch (cause) {
        throw new AsbxError({ status: 0, code: "protocol_error", detail: "a line is not JSON", cause });
      }
      const seq = typeof raw.seq === "number" ? raw.seq : undefined;
      const event = await this.#decode(raw);
      // A replay may repeat lines (the resume loop drops them): act once.
      if (seq === undefined || seq > this.#observed) {
        this.#observe(event);
        if (seq !== undefined) this.#observed = seq;
      }
      const hidden = seq !== undefined && seq <= this.#skipUpTo;
      yield { seq, value: hidden ? undefined : event, end: event.type === "session_ended" };
    }
  }

  async #decode(raw: Record<string, unknown>): Promise<RunEvent> {
    if (raw.type === "session_init" && this.#keys) {
      const init = raw as unknown as SessionInitEvent;
      if (!init.encryption) {
        throw new AsbxError({ status: 0, code: "protocol_error", detail: "encryption asked for, session_init has none" });
      }
      this.#cipher = await (await this.#keys).session(init.encryption, init.sessionId, this.#client.runnerPublicKey);
      return init;
    }
    const sealed = raw.encrypted as Sealed | undefined;
    if (!sealed) return raw as unknown as RunEvent;
    if (!this.#cipher) {
      throw new AsbxError({ status: 0, code: "decryption_failed", detail: "an encrypted line and no session key" });
    }
    const { encrypted: _, ...clear } = raw;
    const opened = await this.#cipher.openLine(raw.seq as number, raw.type as string, sealed);
    return { ...opened, ...clear } as unknown as RunEvent;
  }

  #observe(event: RunEvent): void {
    switch (event.type) {
      case "session_init":
        this.init = event;
        break;
      case "result":
        this.result = event.message;
        break;
      case "error":
        this.error = { code: event.code, message: event.message };
        break;
      case "session_ended": {
        const { type: _t, seq: _s, ts: _ts, sessionId: _id, ...termination } = event;
        this.termination = termination;
        break;
      }
      case "tool_call": {
        const tool = this.#tools[event.toolName];
        if (tool) void this.#answer(tool, event);
        break;
      }
    }
  }

  async #answer(tool: ClientTool, call: ToolCallEvent): Promise<void> {
    let answer: ToolAnswer;
    try {
      answer = { result: (await tool.handler(call.args, call)) ?? null };
    } catch (e) {
      answer = { error: e instanceof Error ? e.message : String(e) };
    }
    // A dropped connection or a 5xx is retried; 409 means an earlier try
    // (or a replay's) already got through.
    for (let attempt = 0; ; attempt++) {
      try {
        await this.respond(call.callId, answer);
        return;
      } catch (e) {
        if (e instanceof AsbxError && e.status === 409) return;
        const retryable = e instanceof AsbxError && (e.code === "connection_lost" || e.status >= 500);
        if (!retryable || attempt >= this.#client.retry.maxAttempts || this.#link.aborted()) {
          this.#toolFailure = e;
          return;
        }
        await new Promise((r) => setTimeout(r, delayOf(this.#client.retry, attempt)));
      }
    }
  }
}
