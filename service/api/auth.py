"""The optional API key: `Authorization: Bearer <key>` on model routes when keys are configured
(`HTMLLM_API_KEY`, `HTMLLM_API_KEY_FILE`: see `service.api.api_keys`).

Probes and scrapers (`/health`, `/ready`, `/metrics`) and the documentation stay open, so a
Kubernetes probe or Prometheus needs no secret. A model route's path needs the key whatever the method
(a wrong one, a CONNECT to it or to `/` included), except where an open route takes the method there
(`GET /`, the liveness probe beside TEI's `POST /`): a 405 with its `Allow` had told a client without a
key which model routes exist.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from starlette.routing import Match, Route, compile_path
from starlette.types import Scope

from service.api.api_keys import ApiKeys
from service.api.errors import ROUTES_STATE
from service.api.runtime import RuntimeDep
from service.core.errors import ErrorCode, HtmllmError

# auto_error=False: a missing or non-Bearer header reaches us as None and becomes our typed 401 (it is
# here for the OpenAPI security scheme; `key_refusal` reads the header itself).
_bearer = HTTPBearer(auto_error=False, description="one of the server's API keys, when it has any")


def key_refusal(keys: ApiKeys, authorization: str | None) -> HtmllmError | None:
    """The 401 for a request whose `Authorization` header (the first, as HTTPBearer reads it) carries
    none of the keys; None where auth is off or it carries one."""
    if not keys.enabled:
        return None
    scheme, credentials = get_authorization_scheme_param(authorization)
    if not (authorization and scheme and credentials) or scheme.lower() != "bearer":
        return HtmllmError("this route needs `Authorization: Bearer <API key>`", code=ErrorCode.UNAUTHORIZED)
    if not keys.accepts(credentials):
        return HtmllmError("the API key is not valid", code=ErrorCode.UNAUTHORIZED)
    return None


def key_gate(keys: ApiKeys, routes: Collection[tuple[str, str]]) -> Callable[[Scope], HtmllmError | None]:
    """`key_refusal` for a request to the path of one of `routes` ((method, path): the model routes,
    a path as the route declares it), whatever its method, unless an open route takes it there
    (`_taken_openly`), from its ASGI scope. The body limit asks it before it reads a byte of the body, so
    that a client without a key cannot make the server read, decode and hold its bodies (16 MB each, up
    to the in-flight budget, which keyed clients then find full) only to be told 401; and before
    routing, so that a client without a key gets one answer on a model route's path whatever its method
    (a wrong method's 405 had come first, with its `Allow`; the route list itself is public in
    /openapi.json)."""
    exact = frozenset(routes)
    paths = frozenset(path for _, path in routes if "{" not in path)
    # (the model lookup's `/v1/models/{model_id:path}`: matched as its route matches it)
    patterns = [compile_path(path)[0] for path in sorted({path for _, path in routes if "{" in path})]

    def refusal(scope: Scope) -> HtmllmError | None:
        if not keys.enabled:
            return None
        if (scope["method"], scope["path"]) not in exact:
            path = scope["path"]
            if path not in paths and not any(pattern.match(path) for pattern in patterns):
                return None
            if _taken_openly(scope, exact):
                return None
        raw = next((value for name, value in scope["headers"] if name == b"authorization"), None)
        return key_refusal(keys, None if raw is None else raw.decode("latin-1"))

    return refusal


def _taken_openly(scope: Scope, keyed: Collection[tuple[str, str]]) -> bool:
    """Whether a route that needs no key (none of its methods `keyed`) takes the request of `scope`, at a
    model route's path: `GET /`, the probe. The app's routes are those a 405's `Allow` is computed from
    (`service.api.errors`); an app that registered none leaves routing to answer, as before."""
    app_routes = getattr(getattr(scope.get("app"), "state", None), ROUTES_STATE, None)
    if app_routes is None:
        return True
    return any(
        isinstance(route, Route)
        and route.methods
        and not any((method, route.path) in keyed for method in route.methods)
        and route.matches(scope)[0] is Match.FULL
        for route in app_routes
    )


async def require_api_key(
    runtime: RuntimeDep,
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless auth is off or the request carries one of the keys."""
    refusal = key_refusal(runtime.api_keys, request.headers.get("authorization"))
    if refusal is not None:
        raise refusal
