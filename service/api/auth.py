"""The optional API key: `Authorization: Bearer <key>` on model routes when keys are configured
(`HTMLLM_API_KEY`, `HTMLLM_API_KEY_FILE`: see `service.api.api_keys`).

Probes and scrapers (`/health`, `/ready`, `/metrics`) and the documentation stay open, so a
Kubernetes probe or Prometheus needs no secret.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from starlette.types import Scope

from service.api.api_keys import ApiKeys
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
    """`key_refusal` for a request to one of `routes` ((method, path): the model routes; a wrong method
    stays a 405), from its ASGI scope: the body limit asks it before it reads a byte of the body, so
    that a client without a key cannot make the server read, decode and hold its bodies (16 MB each, up
    to the in-flight budget, which keyed clients then find full) only to be told 401."""

    def refusal(scope: Scope) -> HtmllmError | None:
        if not keys.enabled or (scope["method"], scope["path"]) not in routes:
            return None
        raw = next((value for name, value in scope["headers"] if name == b"authorization"), None)
        return key_refusal(keys, None if raw is None else raw.decode("latin-1"))

    return refusal


async def require_api_key(
    runtime: RuntimeDep,
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless auth is off or the request carries one of the keys."""
    refusal = key_refusal(runtime.api_keys, request.headers.get("authorization"))
    if refusal is not None:
        raise refusal
