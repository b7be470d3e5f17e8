"""The optional API key: `Authorization: Bearer <key>` on model routes when `HTMLLM_API_KEY` is set.

Probes and scrapers (`/health`, `/ready`, `/metrics`) and the documentation stay open, so a
Kubernetes probe or Prometheus needs no secret.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.api.runtime import RuntimeDep
from service.core.errors import ErrorCode, HtmllmError

# auto_error=False: a missing or non-Bearer header reaches us as None and becomes our typed 401.
_bearer = HTTPBearer(auto_error=False, description="the server's HTMLLM_API_KEY, when one is set")


async def require_api_key(
    runtime: RuntimeDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless auth is off or the request carries the key (compared in constant time)."""
    key = runtime.settings.api_key
    if key is None:
        return
    if credentials is None:
        raise HtmllmError("this route needs `Authorization: Bearer <API key>`", code=ErrorCode.UNAUTHORIZED)
    if not hmac.compare_digest(credentials.credentials.encode(), key.get_secret_value().encode()):
        raise HtmllmError("the API key is not valid", code=ErrorCode.UNAUTHORIZED)
