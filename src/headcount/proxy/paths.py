"""Which requests go to an engine, by path: the endpoints vLLM serves, and any other `/v1/` POST.

Every path in `PROXIED` is a `POST` routed by its body's `model`, a
`multipart/form-data` field for the audio uploads (`FORM_PATHS`). Another
`POST /v1/...` `passes_through` the same way unless the operator turns that off
(`--no-passthrough`): vLLM grows endpoints faster than routers learn them.
`/v1/models` and below are the router's own answer and never pass through;
`GET /v1/responses/{id}` and its cancel go to the engine that stores the
response (`stored_responses.py`).
"""

from __future__ import annotations

from headcount.flow.ticket import NO_COMPLETION_PATHS
from headcount.proxy.stored_responses import response_id_of

__all__ = ["API_PREFIX", "FORM_PATHS", "PROXIED", "RESPONSES", "passes_through"]

RESPONSES = b"/v1/responses"
FORM_PATHS = frozenset({b"/v1/audio/transcriptions", b"/v1/audio/translations"})
PROXIED = frozenset(
    {b"/v1/chat/completions", b"/v1/completions", RESPONSES, *NO_COMPLETION_PATHS, *FORM_PATHS}
)
"""The generating endpoints, those that generate nothing (flow control's
`NO_COMPLETION_PATHS`: embeddings, pooling, tokenizer) and the audio uploads."""
API_PREFIX = b"/v1/"
_LOCAL_API = b"/v1/models"


def passes_through(path: bytes, method: bytes) -> bool:
    """Whether a request not in `PROXIED` is still routed by its `model` (with passthrough
    on): a `POST` under `/v1/` that is neither the router's own nor a stored response's."""
    return (
        method == b"POST"
        and path.startswith(API_PREFIX)
        and not path.startswith(_LOCAL_API)
        and response_id_of(path, method) is None
    )
