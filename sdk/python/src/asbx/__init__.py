"""asbx: a Python client for the asbx workspace.

`Client` (blocking) and `AsyncClient` (asyncio) run Assistant chat turns and
protocol 2 runs, stream their typed events, resume a dropped stream with no
gap and no duplicate, answer client tools with callbacks, and decrypt
end-to-end encrypted runs. The wire is described in the repository's
docs/protocol.md, docs/api-runs.md and docs/api-assistant.md.
"""

from ._async import AsyncChatStream, AsyncClient, AsyncRunStream
from ._crypto import ClientSession
from ._errors import (
    AsbxError,
    BadRequestError,
    ConflictError,
    DecryptionError,
    FieldError,
    ForbiddenError,
    GoneError,
    NotFoundError,
    PayloadTooLargeError,
    ServerError,
    SignatureError,
    StreamError,
    TurnInFlightError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
)
from ._events import (
    Delta,
    Done,
    ErrorEvent,
    Event,
    Heartbeat,
    Limits,
    Log,
    Result,
    SessionEnded,
    SessionInit,
    SessionStats,
    StderrOutput,
    Stdout,
    Step,
    TerminationInfo,
    ToolCall,
    ToolResultApplied,
    Turn,
    UnknownEvent,
)
from ._models import (
    Chat,
    ChatSummary,
    ClientTool,
    Environment,
    FileInfo,
    Message,
    ModelInfo,
    RunInfo,
    WorkspaceEvent,
)
from ._sync import ChatStream, Client, RunStream

__version__ = "0.1.0"

__all__ = [
    "AsbxError",
    "AsyncChatStream",
    "AsyncClient",
    "AsyncRunStream",
    "BadRequestError",
    "Chat",
    "ChatStream",
    "ChatSummary",
    "Client",
    "ClientSession",
    "ClientTool",
    "ConflictError",
    "DecryptionError",
    "Delta",
    "Done",
    "Environment",
    "ErrorEvent",
    "Event",
    "FieldError",
    "FileInfo",
    "ForbiddenError",
    "GoneError",
    "Heartbeat",
    "Limits",
    "Log",
    "Message",
    "ModelInfo",
    "NotFoundError",
    "PayloadTooLargeError",
    "Result",
    "RunInfo",
    "RunStream",
    "ServerError",
    "SessionEnded",
    "SessionInit",
    "SessionStats",
    "SignatureError",
    "StderrOutput",
    "Step",
    "Stdout",
    "StreamError",
    "TerminationInfo",
    "ToolCall",
    "ToolResultApplied",
    "Turn",
    "TurnInFlightError",
    "UnauthorizedError",
    "UnknownEvent",
    "UnsupportedMediaTypeError",
    "WorkspaceEvent",
]
