"""Errors: every HTTP error of asbx is problem+json (docs/protocol.md §6).

`AsbxError.from_response` turns one into the subclass for its status (and,
for a few stable codes, a narrower one). Clients match on `.code`, never on
`.detail`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FieldError:
    """One entry of a problem's `errors`: the field (e.g. `clientTools[0].name`) and why."""

    field: str
    message: str


class AsbxError(Exception):
    """An error answered by asbx, or raised by this SDK about the wire."""

    status: int | None
    code: str
    detail: str
    title: str | None
    errors: list[FieldError]
    problem: dict[str, Any]

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        code: str = "client_error",
        title: str | None = None,
        errors: list[FieldError] | None = None,
        problem: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {detail}" if status else f"{code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.title = title
        self.errors = errors or []
        self.problem = problem or {}

    @staticmethod
    def from_problem(status: int, body: bytes) -> AsbxError:
        """The error for an HTTP answer with `status` and `body` (problem+json or not)."""
        try:
            problem = json.loads(body)
            if not isinstance(problem, dict):
                raise ValueError
        except ValueError:
            text = body.decode("utf-8", "replace").strip()[:500]
            problem = {"code": "http_error", "detail": text or f"HTTP {status}"}
        code = str(problem.get("code") or "http_error")
        errors = [
            FieldError(str(e.get("field", "")), str(e.get("message", "")))
            for e in problem.get("errors") or []
            if isinstance(e, dict)
        ]
        cls = _BY_CODE.get(code) or _BY_STATUS.get(status)
        if cls is None:
            cls = ServerError if status >= 500 else AsbxError
        return cls(
            str(problem.get("detail") or problem.get("title") or f"HTTP {status}"),
            status=status,
            code=code,
            title=problem.get("title"),
            errors=errors,
            problem=problem,
        )


class BadRequestError(AsbxError):
    """400: the request names a bad field (see `.errors`)."""


class UnauthorizedError(AsbxError):
    """401: no API key, or a wrong or revoked one."""


class ForbiddenError(AsbxError):
    """403: refused by policy (e.g. a foreign `Origin`)."""


class NotFoundError(AsbxError):
    """404: no such chat, run, file or call in the caller's workspace."""


class ConflictError(AsbxError):
    """409: e.g. a second turn on a chat with one in flight, a call already answered."""


class TurnInFlightError(ConflictError):
    """409 `turn_in_flight`: the chat already runs a turn (`.problem` names it)."""


class GoneError(AsbxError):
    """410 `events_gone`: the lines asked for are past retention (`.problem["oldestSeq"]`);
    `workdir_gone`: a chat turn's working directory is past `ASBX_WORKDIR_KEEP_TURNS`."""


class PayloadTooLargeError(AsbxError):
    """413 `body_too_large`: the body is over the limit (files: 16 MiB)."""


class UnsupportedMediaTypeError(AsbxError):
    """415: a JSON route got another content type."""


class ServerError(AsbxError):
    """5xx: the workspace or its runner failed, or is at capacity (503)."""


class StreamError(AsbxError):
    """The event stream broke in a way that resuming could not repair."""


class DecryptionError(AsbxError):
    """A sealed line did not open: wrong key, or it was altered, moved or relabelled."""


class SignatureError(AsbxError):
    """`signature_invalid`: an encrypted session's `session_init` is not signed by the
    pinned runner key (`runner_public_key`): its keys were substituted on the way, or
    the run went to another runner. Nothing of the session is decrypted."""


_BY_STATUS: dict[int, type[AsbxError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
}

_BY_CODE: dict[str, type[AsbxError]] = {
    "turn_in_flight": TurnInFlightError,
    "events_gone": GoneError,
    "decryption_failed": DecryptionError,
    "signature_invalid": SignatureError,
}
