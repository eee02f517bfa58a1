"""Typed dependencies for the routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from warmfleet_daemon.api.errors import APIError
from warmfleet_daemon.api.state import DaemonState, Ready


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
