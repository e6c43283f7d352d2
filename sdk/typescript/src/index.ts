/**
 * `@asbx/sdk`: a client of an asbx workspace for Node 20+ and browsers:
 * the platform's `fetch` and WebCrypto, and the `ws` package for the
 * WebSocket transport in Node.
 */

export { AsbxClient, Runs, Agents, Chats, Environments, Audit, type AuditRecord, type AuditPage, type AsbxClientOptions, type AgentRunOptions } from "./client.js";
export { Run, type CreateRunOptions, type ClientTool, type ToolHandler, type ToolAnswer } from "./run.js";
export { ChatTurn, type ChatOptions } from "./chat.js";
export { AsbxError, type FieldError, type ClientErrorCode } from "./errors.js";
export { ClientKeyPair, SessionCipher, verifySessionInit, type Sealed } from "./crypto.js";
export type { RetryOptions, RetryPolicy } from "./resume.js";
export { RunSocket, type Transport } from "./ws.js";
export type * from "./types.js";
export {
  END_REASONS,
  ERROR_CODES,
  EVENT_TYPES,
  LOG_LEVELS,
  OUTPUT_STREAMS,
  STEP_STATUS_VALUES,
  TERMINATED_BY_VALUES,
} from "./generated/unions.js";
export type { paths as WorkspacePaths, components as WorkspaceComponents } from "./openapi/workspace.js";
export type { paths as RunnerPaths, components as RunnerComponents } from "./openapi/runner.js";
