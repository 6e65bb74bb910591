"""The emulator's HTTP application: every route, and every error answered as a ``Status``.

Clients read a refusal's ``Status`` body (its code and reason), never only
the HTTP status, so even aiohttp's own 404 and 405 answers are rewritten.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from headcount.sim.apiserver.admin import SimAdmin
from headcount.sim.apiserver.discovery import Discovery
from headcount.sim.apiserver.faults import Faults
from headcount.sim.apiserver.listener import Listener
from headcount.sim.apiserver.openapi import OpenApi
from headcount.sim.apiserver.rest import ResourceApi
from headcount.sim.apiserver.status import NO_SUCH_RESOURCE, StatusError
from headcount.sim.apiserver.store import Store
from headcount.sim.apiserver.watching import WatchStreams
from headcount.sim.apiserver.wire import status_response

__all__ = ["build_admin_app", "build_app"]

_log = logging.getLogger(__name__)


def build_app(
    store: Store, faults: Faults, listener: Listener, bookmark_interval: float
) -> web.Application:
    """The application serving `store`, held back or silenced by `faults`."""
    app = web.Application(middlewares=[_answer_errors, _hold_when_blackholed(faults)])
    watches = WatchStreams(store, faults, bookmark_interval)
    app.add_routes(
        [
            *Discovery(listener).routes(),
            *OpenApi().routes(),
            *ResourceApi(store, watches).routes(),
            *SimAdmin(store, faults).routes(),
        ]
    )
    return app


def build_admin_app(store: Store, faults: Faults) -> web.Application:
    """The ``/_sim/`` API alone, for the admin port that no fault touches."""
    app = web.Application(middlewares=[_answer_errors])
    app.add_routes(SimAdmin(store, faults).routes())
    return app


@web.middleware
async def _answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except StatusError as error:
        return status_response(error)
    except web.HTTPNotFound:
        return status_response(NO_SUCH_RESOURCE)
    except web.HTTPMethodNotAllowed:
        message = (
            f"the server does not allow this method on the requested resource: {request.method}"
        )
        return status_response(StatusError(405, "MethodNotAllowed", message))
    except web.HTTPException as exc:
        return status_response(
            StatusError(exc.status, exc.reason.replace(" ", ""), exc.text or exc.reason)
        )
    except Exception:
        _log.exception("sim apiserver: %s %s failed", request.method, request.path_qs)
        return status_response(StatusError(500, "InternalError", "internal error"))


def _hold_when_blackholed(faults: Faults) -> Middleware:
    """Requests wait while the server is blackholed; the admin API under /_sim/ never does."""

    @web.middleware
    async def hold(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/_sim/"):
            await faults.until_answering()
        return await handler(request)

    return hold
