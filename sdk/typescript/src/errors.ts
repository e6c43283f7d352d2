/**
 * `AsbxError`: every failure the SDK reports. HTTP errors come from the
 * server's problem+json bodies (docs/protocol.md §6); errors the SDK finds
 * itself carry `status: 0` and a code of their own.
 */

/** One bad field of a request (`errors[]` of a problem). */
export interface FieldError {
  field: string;
  message: string;
}

/** Codes of the errors the SDK raises itself (status 0). */
export type ClientErrorCode =
  /** The connection dropped and could not be resumed. */
  | "connection_lost"
  /** An encrypted line did not open with this session's key. */
  | "decryption_failed"
  /** `session_init` is not signed by the pinned runner key (`runnerPublicKey`). */
  | "signature_invalid"
  /** The server sent something that breaks the protocol. */
  | "protocol_error";

export class AsbxError extends Error {
  /** The HTTP status, or 0 for an error the SDK found itself. */
  readonly status: number;
  /** The stable snake_case code: match on it, never on `detail`. */
  readonly code: string;
  readonly title: string;
  readonly detail: string;
  /** Field errors of a `400 invalid_request`. */
  readonly errors: FieldError[];
  /** The whole problem body, with any extension members. */
  readonly problem: Record<string, unknown>;

  constructor(init: {
    status: number;
    code: string;
    title?: string;
    detail?: string;
    errors?: FieldError[];
    problem?: Record<string, unknown>;
    cause?: unknown;
  }) {
    const detail = init.detail ?? init.title ?? init.code;
    super(`${init.status ? `${init.status} ` : ""}${init.code}: ${detail}`, { cause: init.cause });
    this.name = "AsbxError";
    this.status = init.status;
    this.code = init.code;
    this.title = init.title ?? init.code;
    this.detail = detail;
    this.errors = init.errors ?? [];
    this.problem = init.problem ?? {};
  }

  /** The error of a response that is not ok: its problem+json, or a stand-in. */
  static async fromResponse(res: Response): Promise<AsbxError> {
    const text = await res.text().catch(() => "");
    let body: Record<string, unknown> | undefined;
    try {
      const parsed: unknown = JSON.parse(text);
      if (parsed && typeof parsed === "object" && !Array.isArray(parsed)) {
        body = parsed as Record<string, unknown>;
      }
    } catch {
      body = undefined;
    }
    if (body && typeof body.code === "string") {
      const errors = Array.isArray(body.errors)
        ? (body.errors as unknown[]).filter(isFieldError)
        : [];
      return new AsbxError({
        status: res.status,
        code: body.code,
        title: typeof body.title === "string" ? body.title : undefined,
        detail: typeof body.detail === "string" ? body.detail : undefined,
        errors,
        problem: body,
      });
    }
    return new AsbxError({
      status: res.status,
      code: `http_${res.status}`,
      title: res.statusText || `HTTP ${res.status}`,
      detail: text.slice(0, 500) || res.statusText || `HTTP ${res.status}`,
    });
  }
}

function isFieldError(v: unknown): v is FieldError {
  return (
    !!v &&
    typeof v === "object" &&
    typeof (v as FieldError).field === "string" &&
    typeof (v as FieldError).message === "string"
  );
}
