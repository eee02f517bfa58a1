"""Typed dependencies for the routes."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from warmfleet_common.grants import GRANT_HEADER, grant_refusal, grant_url, urls_reached_at
from warmfleet_common.tls import peer_verified
from warmfleet_daemon.api.errors import APIError
from warmfleet_daemon.api.tenants import reads_with_client_key
from warmfleet_daemon.runtime.assembly import DaemonState, Ready


def get_state(request: Request) -> DaemonState:
    state: DaemonState = request.app.state.daemon
    return state


def get_ready(state: Annotated[DaemonState, Depends(get_state)]) -> Ready:
    if state.ready is None:
        if state.load_error:
            raise APIError(
                503, f"the model failed to load: {state.load_error}", code="model_load_failed"
            )
        raise APIError(503, "the model is still loading; retry shortly", code="model_loading")
    return state.ready


StateDep = Annotated[DaemonState, Depends(get_state)]
ReadyDep = Annotated[Ready, Depends(get_ready)]


def require_client_certificate(request: Request, state: StateDep) -> None:
    """With --tls-client-ca, the admin, warm-set and peer routes also need a client
    certificate that CA signed (mTLS), whatever token or grant comes with them."""
    if state.settings.tls_client_ca and not peer_verified(request.scope):
        raise APIError(
            403,
            "this route needs a client certificate signed by the daemon's --tls-client-ca",
            code="client_certificate_required",
        )


def require_admin(request: Request, state: StateDep) -> None:
    """Admin routes need `Authorization: Bearer <token>` when a token is configured
    (compared in constant time). Without one the daemon only binds to loopback."""
    require_client_certificate(request, state)
    token = state.settings.admin_token
    if not token:
        return
    _check_token(request, token)


def require_peer_reader(request: Request, state: StateDep) -> None:
    """The read-only peer routes (fingerprint, blocks): the admin token, or a peer grant
    (`x-warmfleet-peer-grant`) for the URL this request was addressed to (or one of
    `--public-url`), signed with this daemon's admin token and not expired. A grant that
    fails is a 401."""
    require_client_certificate(request, state)
    token = state.settings.admin_token
    if not token:
        return
    grant = request.headers.get(GRANT_HEADER)
    if grant is None or "authorization" in request.headers:
        _check_token(request, token)
        return
    urls = urls_reached_at(request.headers.get("host", ""), request.scope.get("root_path", ""))
    urls += [grant_url(url) for url in state.settings.public_url]
    refused = grant_refusal(token, urls, grant)
    if refused is not None:
        raise APIError(
            401, f"the peer grant is not valid: {refused}", param=GRANT_HEADER, code="invalid_grant"
        )


def is_admin(request: Request, state: StateDep) -> bool:
    """For routes with a public and an admin view: True with no token configured or
    the valid one presented, False without an Authorization header; a wrong token is
    refused (403) rather than silently answered with the public view."""
    token = state.settings.admin_token
    if not token:
        return True
    if "authorization" not in request.headers or reads_with_client_key():
        return False
    _check_token(request, token)
    require_client_certificate(request, state)
    return True


def _check_token(request: Request, token: str) -> None:
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise APIError(
            401,
            "this route needs an admin token: Authorization: Bearer <token>",
            code="missing_token",
        )
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise APIError(403, "the admin token is not valid", code="invalid_token")


AdminDep = Depends(require_admin)
PeerReaderDep = Depends(require_peer_reader)
IsAdminDep = Annotated[bool, Depends(is_admin)]
