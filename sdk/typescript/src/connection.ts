/**
 * What a run or a chat turn needs of the client that started it: its base
 * URL, retry policy and transport, one request, and the few `runs` and
 * `chats` calls they make. `AsbxClient` is one; `run.ts` and `chat.ts` name
 * only this, so they and `client.ts` (which makes them) never import each
 * other.
 */

import type { RetryPolicy } from "./resume.js";
import type { RunInfo } from "./types.js";
import type { Transport } from "./ws.js";

/** One request's options (`AsbxClient.request`). */
export interface RequestInit2 {
  json?: unknown;
  body?: BodyInit;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  accept?: string;
  /** Sends after a 429/503 or a network error (idempotent only); default the client's `maxRetries`. */
  retries?: number;
}

/** The client as a run or a chat turn sees it. */
export interface Connection {
  readonly baseUrl: string;
  /** How a dropped stream is reconnected. */
  readonly retry: RetryPolicy;
  /** The runner's identity key an encrypted run's `session_init` is checked against. */
  readonly runnerPublicKey: string | undefined;
  /** How runs stream by default. */
  readonly transport: Transport;
  /** The headers a WebSocket opens with (the API key). */
  socketHeaders(): Record<string, string>;
  /** One request; a response that is not ok becomes an `AsbxError`. */
  request(method: string, path: string, init?: RequestInit2): Promise<Response>;
  readonly runs: {
    get(id: string): Promise<RunInfo>;
    cancel(id: string): Promise<void>;
  };
  readonly chats: {
    cancel(id: string): Promise<void>;
  };
}
