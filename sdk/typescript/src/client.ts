/**
 * `AsbxClient`: the HTTP client of an asbx workspace (docs/protocol.md §7),
 * with the runs API (`client.runs`), stored agents (`client.agents`), chat
 * turns (`client.chat`), chats (`client.chats`) and environments
 * (`client.environments`). Uses only the platform's `fetch` and WebCrypto.
 */

import type { RequestInit2 } from "./connection.js";
import { AsbxError } from "./errors.js";
import { delayOf, retryPolicy, type RetryOptions, type RetryPolicy } from "./resume.js";
import type { Transport } from "./ws.js";
import { Run, type CreateRunOptions, type ToolAnswer } from "./run.js";
import { ChatTurn, type ChatOptions } from "./chat.js";
import { AbortLink } from "./abort.js";
import { sseMessages } from "./streams.js";
import type {
  AgentDefinition,
  AgentRecord,
  ChatSettings,
  ChatSettingsView,
  ChatSummary,
  ChatThread,
  EnvironmentCreate,
  EnvironmentInfo,
  EnvironmentUpdate,
  FileInfo,
  ModelInfo,
  RunInfo,
  Usage,
  WorkspaceChatEvent,
} from "./types.js";

export interface AsbxClientOptions {
  /** The workspace URL (`asbx up` prints it as `open URL`); default `$ASBX_URL` (Node). */
  baseUrl?: string;
  /** A workspace API key (`asbx key`), sent as `Authorization: Bearer`; default `$ASBX_API_KEY` (Node). */
  apiKey?: string;
  /** A `fetch` to use instead of the global one. */
  fetch?: typeof fetch;
  /** How a dropped stream is reconnected: `maxAttempts`, `initialDelayMs`, `backoffMultiplier`, `maxDelayMs`. */
  retry?: RetryOptions;
  /**
   * How many times a request answered `429` or `503` (or, for GET, PUT and
   * DELETE, lost to a network error) is sent again, after its `Retry-After`
   * (at most 60 s) or the `retry` delays (default 2).
   */
  maxRetries?: number;
  /**
   * The runner's identity key (`GET /v1/identity` of the runner, or its
   * `identity.pub`): an encrypted run whose `session_init` this key did not
   * sign fails with `AsbxError` `signature_invalid` (docs/protocol.md §4).
   */
  runnerPublicKey?: string;
  /** How runs stream: `"http"` (NDJSON, default) or `"websocket"` (`GET /api/runs/ws`, docs/protocol.md §13). */
  transport?: Transport;
}

/** Methods a lost connection may repeat: sending one twice does no harm. */
const IDEMPOTENT = new Set(["GET", "HEAD", "OPTIONS", "PUT", "DELETE"]);
/** The longest `Retry-After` honoured. */
const MAX_RETRY_AFTER_MS = 60_000;

/** A `Retry-After` (seconds or an HTTP date) in milliseconds, capped at 60 s. */
export function retryAfterMs(value: string | null): number | undefined {
  if (!value) return undefined;
  const secs = Number(value.trim());
  const ms = Number.isFinite(secs) ? secs * 1000 : Date.parse(value) - Date.now();
  if (Number.isNaN(ms)) return undefined;
  return Math.min(Math.max(ms, 0), MAX_RETRY_AFTER_MS);
}

function env(name: string): string | undefined {
  const proc = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return proc?.env?.[name] || undefined;
}

function pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

export class AsbxClient {
  readonly baseUrl: string;
  readonly runs: Runs;
  readonly agents: Agents;
  readonly chats: Chats;
  readonly environments: Environments;
  /** The workspace's tamper-evident audit log (docs/api-audit.md). */
  readonly audit: Audit;
  /** The reconnect settings in force. */
  readonly retry: RetryPolicy;
  /** How many times a request is sent again after a 429/503 (see `AsbxClientOptions`). */
  readonly maxRetries: number;
  /** The pinned runner identity key, if any. */
  readonly runnerPublicKey: string | undefined;
  /** How runs stream unless a run says otherwise. */
  readonly transport: Transport;
  readonly #apiKey: string | undefined;
  readonly #fetch: typeof fetch;

  constructor(options: AsbxClientOptions = {}) {
    const baseUrl = options.baseUrl ?? env("ASBX_URL");
    if (!baseUrl) throw new TypeError("AsbxClient: baseUrl is required (or set ASBX_URL)");
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.#apiKey = options.apiKey ?? env("ASBX_API_KEY");
    this.#fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.retry = retryPolicy(options.retry);
    this.maxRetries = options.maxRetries ?? 2;
    if (!(this.maxRetries >= 0)) throw new RangeError("AsbxClient: maxRetries must be >= 0");
    this.runnerPublicKey = options.runnerPublicKey;
    this.transport = options.transport ?? "http";
    this.runs = new Runs(this);
    this.agents = new Agents(this);
    this.chats = new Chats(this);
    this.environments = new Environments(this);
    this.audit = new Audit(this);
  }

  /** @internal The headers a WebSocket upgrade carries (the API key). */
  socketHeaders(): Record<string, string> {
    return this.#apiKey ? { authorization: `Bearer ${this.#apiKey}` } : {};
  }

  /** `GET /api/models`: the models a chat or run can name. */
  async models(): Promise<ModelInfo[]> {
    return (await this.json<{ models: ModelInfo[] }>("GET", "/api/models")).models;
  }

  /**
   * `GET /api/usage`: the workspace's quotas (`null`: unlimited) and what
   * it used, by quota name (`concurrent-sandboxes`, `requests-per-minute`,
   * `sandbox-seconds-per-day`, `tokens-per-day`, `storage-mb`).
   */
  async usage(): Promise<Usage> {
    return this.json<Usage>("GET", "/api/usage");
  }

  /**
   * `GET /api/assistant/events`: the workspace's chat events (a turn
   * started or ended, a chat deleted or changed) as they happen, until
   * `signal` aborts (the iteration then ends quietly) or the server closes.
   */
  async *events(options: { signal?: AbortSignal } = {}): AsyncGenerator<WorkspaceChatEvent> {
    const link = new AbortLink(options.signal, () => link.controller.abort());
    let res: Response;
    try {
      res = await this.request("GET", "/api/assistant/events", {
        accept: "text/event-stream",
        signal: link.controller.signal,
      });
    } catch (e) {
      if (link.aborted()) return;
      throw e;
    }
    if (!res.body) return;
    try {
      for await (const msg of sseMessages(res.body)) {
        if (msg.event !== "chat") continue;
        yield { type: "chat", ...(JSON.parse(msg.data) as Omit<WorkspaceChatEvent, "type">) };
      }
    } catch (e) {
      if (link.aborted()) return;
      throw e;
    }
  }

  /**
   * Runs one Assistant turn (`POST /api/assistant/chat/stream`): iterate the
   * result for its events. Without `chatId` the turn starts a new chat.
   */
  chat(options: ChatOptions): ChatTurn {
    return new ChatTurn(this, options);
  }

  /**
   * One request; a response that is not ok becomes an `AsbxError` (its
   * problem+json), a network failure one with code `connection_lost`.
   * @internal
   */
  async request(method: string, path: string, init: RequestInit2 = {}): Promise<Response> {
    const headers: Record<string, string> = { ...init.headers };
    if (this.#apiKey) headers.authorization = `Bearer ${this.#apiKey}`;
    if (init.accept) headers.accept = init.accept;
    let body = init.body;
    if (init.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(init.json);
    }
    const retries = init.retries ?? this.maxRetries;
    for (let n = 0; ; n++) {
      let res: Response;
      try {
        res = await this.#fetch(`${this.baseUrl}${path}`, {
          method,
          headers,
          ...(body !== undefined ? { body } : {}),
          ...(init.signal ? { signal: init.signal } : {}),
        });
      } catch (cause) {
        if (init.signal?.aborted) throw init.signal.reason;
        if (n < retries && IDEMPOTENT.has(method)) {
          await pause(delayOf(this.retry, n), init.signal);
          continue;
        }
        throw new AsbxError({ status: 0, code: "connection_lost", detail: `${method} ${path}: ${String(cause)}`, cause });
      }
      if ((res.status === 429 || res.status === 503) && n < retries) {
        const wait = retryAfterMs(res.headers.get("retry-after")) ?? delayOf(this.retry, n);
        await res.body?.cancel().catch(() => {});
        await pause(wait, init.signal);
        continue;
      }
      if (!res.ok) throw await AsbxError.fromResponse(res);
      return res;
    }
  }

  /** A request whose answer is JSON (or nothing, for `204`). @internal */
  async json<T>(method: string, path: string, init: RequestInit2 = {}): Promise<T> {
    const res = await this.request(method, path, { accept: "application/json", ...init });
    if (res.status === 204) return undefined as T;
    const text = await res.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }
}

/**
 * One audit record (docs/api-audit.md): the chain fields, `kind`, and the
 * kind's own fields (`host`, `allowed`, `model`, `inputTokens`, ...).
 */
export interface AuditRecord {
  id: number;
  ts: number;
  workspace: string;
  runId?: string;
  sessionId?: string;
  kind: string;
  prevHash: string;
  hash: string;
  [field: string]: unknown;
}

/** Where a page of audit records starts and how long it is. */
export interface AuditPage {
  /** Records with `id` above this (default 0). */
  after?: number;
  /** At most this many (1 to 10,000; default 1,000). */
  limit?: number;
}

/** The audit log (`GET /api/audit`, `GET /api/runs/{id}/audit`). */
export class Audit {
  constructor(private readonly client: AsbxClient) {}

  /** The workspace's records, oldest first. */
  list(page: AuditPage = {}): Promise<AuditRecord[]> {
    return this.#page("/api/audit", page);
  }

  /** One run's records, oldest first. */
  ofRun(runId: string, page: AuditPage = {}): Promise<AuditRecord[]> {
    return this.#page(`/api/runs/${encodeURIComponent(runId)}/audit`, page);
  }

  async #page(path: string, page: AuditPage): Promise<AuditRecord[]> {
    const q = new URLSearchParams({ after: String(page.after ?? 0) });
    if (page.limit !== undefined) q.set("limit", String(page.limit));
    const res = await this.client.request("GET", `${path}?${q}`, { accept: "application/x-ndjson" });
    const text = await res.text();
    return text
      .split("\n")
      .filter((l) => l.trim() !== "")
      .map((l) => JSON.parse(l) as AuditRecord);
  }
}

/** The runs API (`/api/runs`, docs/protocol.md §7). */
export class Runs {
  constructor(private readonly client: AsbxClient) {}

  /**
   * Starts a protocol 2 run (`POST /api/runs`, or a stored agent's with
   * `agentId`): iterate the result for its events. The request starts at
   * once; its errors surface from the iteration and from `run.ready`.
   */
  create(options: CreateRunOptions): Run {
    return Run.create(this.client, options);
  }

  /** Follows an existing run from after `after` (`GET /api/runs/{id}/events`). */
  attach(id: string, options: { after?: number; signal?: AbortSignal; transport?: Transport } = {}): Run {
    return Run.attach(this.client, id, options.after ?? 0, options.signal, options.transport);
  }

  /** `GET /api/runs/{id}`: status, result or error, and `termination` once ended. */
  get(id: string): Promise<RunInfo> {
    return this.client.json("GET", `/api/runs/${encodeURIComponent(id)}`);
  }

  /** `DELETE /api/runs/{id}`: ends the run (`terminated` by `daemon`). */
  async cancel(id: string): Promise<void> {
    await this.client.request("DELETE", `/api/runs/${encodeURIComponent(id)}`);
  }

  /** Answers a client tool call of a plaintext run (`POST /api/runs/{id}/tool-result`). */
  async toolResult(id: string, callId: string, answer: ToolAnswer): Promise<void> {
    await this.client.request("POST", `/api/runs/${encodeURIComponent(id)}/tool-result`, {
      json: { callId, ...answer },
    });
  }
}

/** Options of `client.agents.run`: a run's protocol 2 choices (the agent's definition sets the rest). */
export type AgentRunOptions = Pick<CreateRunOptions, "prompt" | "filter" | "tools" | "clientTools" | "encrypt" | "signal">;

/** Stored agents (`/api/agents`, docs/api-agents.md). */
export class Agents {
  constructor(private readonly client: AsbxClient) {}

  /** `POST /api/agents`: stores an agent; a bad field is `400` naming it. */
  create(definition: AgentDefinition): Promise<AgentRecord> {
    return this.client.json("POST", "/api/agents", { json: definition });
  }

  /** `GET /api/agents`. */
  async list(): Promise<AgentRecord[]> {
    return (await this.client.json<{ agents: AgentRecord[] }>("GET", "/api/agents")).agents;
  }

  /** `GET /api/agents/{id}`. */
  get(id: string): Promise<AgentRecord> {
    return this.client.json("GET", `/api/agents/${encodeURIComponent(id)}`);
  }

  /** `PUT /api/agents/{id}`: replaces the definition whole. */
  update(id: string, definition: AgentDefinition): Promise<AgentRecord> {
    return this.client.json("PUT", `/api/agents/${encodeURIComponent(id)}`, { json: definition });
  }

  /** `DELETE /api/agents/{id}`. */
  async delete(id: string): Promise<void> {
    await this.client.request("DELETE", `/api/agents/${encodeURIComponent(id)}`);
  }

  /**
   * Runs the stored agent on `prompt` (`POST /api/agents/{id}/runs`):
   * iterate the result for its events, as `client.runs.create`'s.
   */
  run(id: string, options: AgentRunOptions): Run {
    return Run.create(this.client, { ...options, agentId: id });
  }
}

/** Chats of the Assistant (`/api/assistant/chats`). */
export class Chats {
  constructor(private readonly client: AsbxClient) {}

  /** Newest first. */
  list(): Promise<ChatSummary[]> {
    return this.client.json("GET", "/api/assistant/chats");
  }

  /**
   * The thread: its messages (oldest first), the chat's files and settings.
   * `limit`/`before` page it: the newest `limit` messages before the cursor
   * `before` (the previous page's `before`).
   */
  get(id: string, page: { limit?: number; before?: string | number } = {}): Promise<ChatThread> {
    const q = new URLSearchParams();
    if (page.limit !== undefined) q.set("limit", String(page.limit));
    if (page.before !== undefined && page.before !== null) q.set("before", String(page.before));
    const qs = q.toString() ? `?${q}` : "";
    return this.client.json("GET", `/api/assistant/chats/${encodeURIComponent(id)}${qs}`);
  }

  /** `PUT /api/assistant/chats/{id}/settings`. */
  updateSettings(id: string, settings: ChatSettings): Promise<ChatSettingsView> {
    return this.client.json("PUT", `/api/assistant/chats/${encodeURIComponent(id)}/settings`, { json: settings });
  }

  /** Deletes a chat (a turn in flight is cancelled). */
  async delete(id: string): Promise<void> {
    await this.client.request("DELETE", `/api/assistant/chats/${encodeURIComponent(id)}`);
  }

  /** Asks the runner to end the chat's turn in flight. */
  async cancel(id: string): Promise<void> {
    await this.client.request("POST", `/api/assistant/chats/${encodeURIComponent(id)}/cancel`);
  }

  /**
   * Forks a chat after one of its assistant messages: a new chat with the
   * history up to it and the working directory as that turn left it.
   */
  async fork(id: string, afterMessageId: string): Promise<string> {
    const forked: { id: string } = await this.client.json(
      "POST",
      `/api/assistant/chats/${encodeURIComponent(id)}/fork`,
      { json: { afterMessageId } },
    );
    return forked.id;
  }

  /**
   * The chat's kept working directory as a tar archive, streamed: the
   * latest, or as the turn of `afterMessageId` left it.
   */
  async workdirTar(id: string, afterMessageId?: string): Promise<ReadableStream<Uint8Array>> {
    const qs = afterMessageId ? `?afterMessageId=${encodeURIComponent(afterMessageId)}` : "";
    const res = await this.client.request(
      "GET",
      `/api/assistant/chats/${encodeURIComponent(id)}/workdir.tar${qs}`,
      { accept: "application/x-tar" },
    );
    if (!res.body) throw new Error("workdir.tar: the answer has no body");
    return res.body;
  }

  /**
   * Uploads an attachment (`POST /api/assistant/files`, at most 16 MiB);
   * pass its `id` in a turn's `attachmentIds`.
   */
  upload(
    data: Blob | ArrayBuffer | Uint8Array | string,
    options: { name: string; mimeType?: string; chatId?: string },
  ): Promise<FileInfo> {
    const q = new URLSearchParams({ name: options.name });
    if (options.chatId) q.set("chatId", options.chatId);
    const mime = options.mimeType ?? (data instanceof Blob && data.type ? data.type : "application/octet-stream");
    return this.client.json("POST", `/api/assistant/files?${q}`, {
      body: data as BodyInit,
      headers: { "content-type": mime },
    });
  }
}

/** Named environments of the workspace (`/api/environments`). */
export class Environments {
  constructor(private readonly client: AsbxClient) {}

  async list(): Promise<EnvironmentInfo[]> {
    return (await this.client.json<{ environments: EnvironmentInfo[] }>("GET", "/api/environments")).environments;
  }

  get(id: string): Promise<EnvironmentInfo> {
    return this.client.json("GET", `/api/environments/${encodeURIComponent(id)}`);
  }

  /** A second live environment of the same name is `409 conflict`. */
  create(env: EnvironmentCreate): Promise<EnvironmentInfo> {
    return this.client.json("POST", "/api/environments", { json: env });
  }

  update(id: string, env: EnvironmentUpdate): Promise<EnvironmentInfo> {
    return this.client.json("PUT", `/api/environments/${encodeURIComponent(id)}`, { json: env });
  }

  async delete(id: string): Promise<void> {
    await this.client.request("DELETE", `/api/environments/${encodeURIComponent(id)}`);
  }
}
