"""The optional API key: `Authorization: Bearer <key>` on model routes when keys are configured
(`HTMLLM_API_KEY`, `HTMLLM_API_KEY_FILE`: see `service.api.api_keys`).

Probes and scrapers (`/health`, `/ready`, `/metrics`) and the documentation stay open, so a
Kubernetes probe or Prometheus needs no secret.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.api.runtime import RuntimeDep
from service.core.errors import ErrorCode, HtmllmError

# auto_error=False: a missing or non-Bearer header reaches us as None and becomes our typed 401.
_bearer = HTTPBearer(auto_error=False, description="one of the server's API keys, when it has any")


async def require_api_key(
    runtime: RuntimeDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless auth is off or the request carries one of the keys."""
    keys = runtime.api_keys
    if not keys.enabled:
        return
    if credentials is None:
        raise HtmllmError("this route needs `Authorization: Bearer <API key>`", code=ErrorCode.UNAUTHORIZED)
    if not keys.accepts(credentials.credentials):
        raise HtmllmError("the API key is not valid", code=ErrorCode.UNAUTHORIZED)
