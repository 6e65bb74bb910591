"""Errors as the real API server reports them: a ``Status`` object with a code and a reason.

Clients branch on ``code`` and ``reason`` (a 410 ``Expired`` means relist), so
each refusal carries the exact pair the real server answers with.
"""

from __future__ import annotations

from headcount.sim.apiserver.objects import JsonObject
from headcount.sim.apiserver.resources import Resource

__all__ = [
    "NO_SUCH_RESOURCE",
    "StatusError",
    "bad_request",
    "invalid",
    "not_found",
    "too_old",
]


class StatusError(Exception):
    """A request the real API server would refuse, carrying the ``Status`` it would answer.

    Raised by the Python API too: ``sim.delete_pod("default", "gone")`` raises
    ``StatusError`` with ``code == 404`` and ``reason == "NotFound"``.
    """

    def __init__(
        self, code: int, reason: str, message: str, details: JsonObject | None = None
    ) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def to_status(self) -> JsonObject:
        """The ``Status`` object, as the server puts it in a body or an ERROR event."""
        status: JsonObject = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            status["details"] = self.details
        status["code"] = self.code
        return status


def bad_request(message: str) -> StatusError:
    return StatusError(400, "BadRequest", message)


def invalid(resource: Resource, name: str, message: str) -> StatusError:
    details = {"name": name, "group": resource.group, "kind": resource.kind}
    kind = f"{resource.kind}.{resource.group}" if resource.custom else resource.kind
    return StatusError(422, "Invalid", f'{kind} "{name}" is invalid: {message}', details)


def not_found(resource: Resource, name: str) -> StatusError:
    details = {"name": name, "group": resource.group, "kind": resource.plural}
    return StatusError(404, "NotFound", f'{resource.plural} "{name}" not found', details)


def too_old(requested: int, oldest: int) -> StatusError:
    return StatusError(410, "Expired", f"too old resource version: {requested} ({oldest})")


NO_SUCH_RESOURCE = StatusError(404, "NotFound", "the server could not find the requested resource")
