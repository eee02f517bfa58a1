"""What the schemathesis tests of the daemon's and the router's OpenAPI documents share:
how many cases, the conformance checks, and generated bodies kept cheap to answer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)

# 25 cases an operation, the same ones every run, however slow the app is to answer.
CASES = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
# No 5xx; every status code documented for its operation, every body as documented.
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance]


def cap(case: Any, fields: Iterable[str], most: int) -> None:
    """Lowers the integer `fields` of `case`'s generated JSON body to `most` at the most
    (a generated body may ask for thousands of tokens)."""
    if isinstance(case.body, dict):
        for field in fields:
            if isinstance(case.body.get(field), int) and case.body[field] > most:
                case.body[field] = most
