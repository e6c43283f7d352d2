/**
 * The wire types of asbx, written after `docs/protocol.md` §2, §4 and §7
 * (the JSON Schemas under `schemas/` are the source of truth).
 */

import type { components } from "./openapi/workspace.js";
import type {
  EndReason,
  ErrorCode as KnownErrorCode,
  LogLevel,
  OutputStream,
  StepStatus,
  TerminatedBy,
} from "./generated/unions.js";

/**
 * The string unions of the wire, generated from the JSON Schemas under
 * `schemas/` (`npm run gen:unions`; test.sh fails when they drift).
 */
export type {
  EndReason,
  EventType,
  LogLevel,
  OutputStream,
  StepStatus,
  TerminatedBy,
} from "./generated/unions.js";
export type { KnownErrorCode };

/**
 * The workspace's schemas, generated from its OpenAPI document
 * (`openapi/workspace.json`) by openapi-typescript: `npm run gen:types`.
 * The REST types below are these; the streaming layer's event types are
 * written by hand (they follow docs/protocol.md, one type per line).
 */
export type Schemas = components["schemas"];

/** Stamp every line carries (docs/protocol.md §2). */
export interface LineStamp {
  /** 1, 2, 3, ... per session, without gaps before filtering. */
  seq: number;
  /** Unix milliseconds. */
  ts: number;
  sessionId: string;
}

/**
 * Error codes of `error` lines (docs/protocol.md §2): the stable ones
 * (`KnownErrorCode`, generated from `schemas/error-code.json`), or another
 * snake_case code an agent chose.
 */
export type ErrorCode = KnownErrorCode | (string & {});

export interface LogEvent extends LineStamp {
  type: "log";
  level: LogLevel;
  message: string;
}

export interface StepEvent extends LineStamp {
  type: "step";
  id: string;
  name: string;
  status: StepStatus;
  args?: unknown;
  result?: unknown;
  error?: string | null;
  durationMs?: number | null;
}

export interface ResultEvent extends LineStamp {
  type: "result";
  message: string;
}

export interface ErrorEvent extends LineStamp {
  type: "error";
  code: ErrorCode;
  message: string;
}

export interface SessionLimits {
  maxDurationMs: number;
  maxSteps: number;
  maxToolCalls: number;
  heartbeatIntervalMs: number;
}

/** The server half of the encryption handshake (docs/protocol.md §4). */
export interface EncryptionInit {
  algorithm: string;
  serverPublicKey: string;
  salt: string;
  /**
   * The runner's identity key's ECDSA P-256 SHA-256 signature (`r || s`,
   * base64url) of `"asbx-e2e-v1-sig:" + sessionId + "." + serverPublicKey + "." + salt`.
   */
  signature: string;
  /** The runner's identity public key (`GET /v1/identity`), as it names itself. */
  identityKey: string;
}

export interface SessionInitEvent extends LineStamp {
  type: "session_init";
  protocolVersion: 2;
  limits: SessionLimits;
  encryption?: EncryptionInit | null;
}

export interface DeltaEvent extends LineStamp {
  type: "delta";
  text: string;
}

export interface StdoutEvent extends LineStamp {
  type: "stdout";
  stepId: string;
  stream: OutputStream;
  chunk: string;
  /** Chat streams only: this line crossed the 64 KiB per-step cap. */
  truncated?: boolean;
}

export interface ToolCallEvent extends LineStamp {
  type: "tool_call";
  callId: string;
  toolName: string;
  args: unknown;
}

export interface ToolResultAppliedEvent extends LineStamp {
  type: "tool_result_applied";
  callId: string;
}

export interface HeartbeatEvent extends LineStamp {
  type: "heartbeat";
}

/** Head and tail of the sandbox process's stderr. */
export interface StderrOutput {
  head?: string | null;
  tail?: string | null;
  truncated: boolean;
  totalLines: number;
}

export interface SessionStats {
  durationMs: number;
  steps: number;
  toolCalls: number;
  inputTokens: number;
  outputTokens: number;
}

/**
 * How a session ended: the `session_ended` payload, also a run's
 * `termination` (docs/protocol.md §4).
 */
export interface TerminationInfo {
  reason: EndReason;
  terminatedBy: TerminatedBy;
  /** Why, whenever `reason` is `error` or `terminated`. */
  message?: string | null;
  exitCode?: number | null;
  signal?: number | null;
  stderr?: StderrOutput | null;
  stats: SessionStats;
}

export interface SessionEndedEvent extends LineStamp, TerminationInfo {
  type: "session_ended";
}

/** One line of a run (protocol 2), decrypted when the run is encrypted. */
export type RunEvent =
  | SessionInitEvent
  | LogEvent
  | DeltaEvent
  | StepEvent
  | StdoutEvent
  | ToolCallEvent
  | ToolResultAppliedEvent
  | HeartbeatEvent
  | ResultEvent
  | ErrorEvent
  | SessionEndedEvent;

/** First event of a chat turn. */
export interface TurnEvent {
  type: "turn";
  chatId: string;
  turnId: string;
  userMessageId: string;
}

/** Last event of a chat turn: the stored assistant message. */
export interface DoneEvent {
  type: "done";
  chatId: string;
  turnId: string;
  status: "succeeded" | "failed" | "cancelled";
  messageId: string;
}

/** An event of a chat turn's SSE stream (docs/protocol.md §7). */
export type ChatEvent = TurnEvent | Exclude<RunEvent, LogEvent | HeartbeatEvent> | DoneEvent;

/** A client tool as the model sees it. */
export interface ClientToolSpec {
  name: string;
  description?: string;
  /** JSON Schema of the arguments. */
  parameters?: unknown;
}

/** A skill installed into the sandbox. */
export interface Skill {
  name: string;
  files: Record<string, string> | unknown;
  [key: string]: unknown;
}

/** Limits of one run (the workspace's OpenAPI document). */
export type RunLimits = Schemas["RunLimits"];

/** `{"types": [..]}` or `{"blockedTypes": [..]}`. */
export type Filter = { types: RunEvent["type"][] } | { blockedTypes: RunEvent["type"][] };

/** The body of `POST /api/runs` the SDK sends (always `"protocol": 2`). */
export interface CreateRunBody {
  prompt: string;
  model?: string;
  systemPrompt?: string;
  setupScript?: string;
  variables?: Record<string, string>;
  allowedHosts?: string[];
  limits?: RunLimits;
  skills?: Skill[];
  mcpServers?: unknown[];
  filter?: Filter;
  /** Workspace environment (name or id), where the server supports it. */
  environment?: string;
  /**
   * Start the sandbox's working directory from a chat's kept one
   * (CONTRACT §11): `{ from: chatId }` its latest, `afterMessageId` as that
   * assistant message's turn left it. The run keeps nothing back.
   */
  workdir?: RunWorkdir;
}

/** `workdir` of a run: the chat (and turn) whose kept directory it starts from. */
export type RunWorkdir = Schemas["RunWorkdir"];

/**
 * `GET /api/runs/{id}`: `kind` (`run`, `chat`, `agent`), `chatId` or
 * `agentId`, `status`, `result` or `error`, `files`, and `termination` once
 * ended (the workspace's `RunRecord`).
 */
export type RunInfo = Schemas["RunRecord"];

/** A file in the workspace (`POST /api/assistant/files`). */
export type FileInfo = Schemas["FileInfo"];

/** An entry of `GET /api/assistant/chats`. */
export type ChatSummary = Schemas["ChatSummary"];

/** A message block of a chat thread. */
export interface ChatMessage {
  id: string;
  role: "user" | "assistant";
  content: Array<{ type: string; [key: string]: unknown }>;
  [key: string]: unknown;
}

/** `GET /api/assistant/chats/{id}`. */
export interface ChatThread {
  id: string;
  title?: string | null;
  messages: ChatMessage[];
  files?: FileInfo[];
  settings?: ChatSettingsView;
  /** Cursor of the next older page (`get(id, {before})`), `null` when none. */
  before?: string | number | null;
  [key: string]: unknown;
}

/** A named environment of the workspace (secret values are never answered). */
export type EnvironmentInfo = Schemas["EnvironmentRecord"];

/** `POST /api/environments`. */
export interface EnvironmentCreate {
  name: string;
  variables?: Record<string, string>;
  secrets?: Record<string, string>;
  setupScript?: string | null;
  allowedHosts?: string[];
}

/**
 * `PUT /api/environments/{id}`: `secrets` absent keeps them all; a key set
 * to `null` deletes that secret, a string sets it.
 */
export interface EnvironmentUpdate {
  name: string;
  variables?: Record<string, string>;
  secrets?: Record<string, string | null>;
  setupScript?: string | null;
  allowedHosts?: string[];
}

/**
 * A stored agent's definition (`POST /api/agents`, `PUT /api/agents/{id}`,
 * docs/api-agents.md): `name` and what its runs get.
 */
export type AgentDefinition = Schemas["AgentDefinition"];

/** A stored agent as answered: its definition, `id`, `createdAt`, `updatedAt`. */
export type AgentRecord = Schemas["AgentRecord"];

/** `GET /api/usage`: the workspace's quotas (`null`: unlimited) and usage, by quota name. */
export type Usage = Schemas["Usage"];

/** A model of `GET /api/models` (`id` is `provider:model`). */
export type ModelInfo = Schemas["ModelInfo"];

/** A chat's settings (first turn, or `PUT /api/assistant/chats/{id}/settings`). */
export interface ChatSettings {
  model?: string;
  systemPrompt?: string;
  environmentId?: string;
  skills?: Skill[];
  mcpServers?: unknown[];
}

/** A chat's settings as answered, with what a turn uses now. */
export type ChatSettingsView = Schemas["ChatSettingsView"];

/** `event: chat` of `GET /api/assistant/events`. */
export interface WorkspaceChatEvent {
  type: "chat";
  chatId: string;
  turnId?: string;
  state: "started" | "ended" | "deleted" | "updated";
  title?: string;
}
