"""One APIRouter per concern: probes and info, embedding, the compatible APIs, preprocessing, extraction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


def get_route(router: APIRouter, path: str, **options: Any) -> Callable[[Endpoint], Endpoint]:
    """GET `path` on `router`, and HEAD: load balancers and uptime checkers (AWS target groups, HAProxy's
    `option httpchk HEAD`, monit) probe with HEAD, and a 405 there marks a healthy server down. HEAD runs
    the GET endpoint and answers its status and headers; the server sends no body. Every GET route takes
    HEAD: the documentation pages are Starlette's routes, which add it to GET themselves.

    Two routes: the first, out of the OpenAPI document, serves both methods (and a 405's `Allow` names
    both); the second, never reached, documents GET alone. One documented route with both methods gave
    both operations one operationId, which OpenAPI forbids and client generators trip on."""

    def register(endpoint: Endpoint) -> Endpoint:
        router.api_route(path, methods=["GET", "HEAD"], include_in_schema=False)(endpoint)
        return router.get(path, **options)(endpoint)

    return register
