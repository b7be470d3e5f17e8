"""The OpenAPI document: error responses on every route, and the raw-body alternatives FastAPI cannot infer.

Routes read their bodies themselves (JSON or one raw page; JSON with or without a Content-Type), so
FastAPI does not see a body parameter; `raw_body_openapi` and `json_body_openapi` declare the content
types and `install_openapi` adds the JSON schemas they reference to the components.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from service.api.schemas import ErrorBody

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in (
        (400, "empty input"),
        (401, "missing or wrong API key"),
        (413, "body over the byte limit"),
        (415, "unsupported Content-Type"),
        (422, "invalid request, too many documents or tokens, unknown head"),
        (429, "queue full: retry after `Retry-After` seconds"),
        (503, "not ready or shutting down"),
        (504, "request timeout"),
    )
}


def raw_body_openapi(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route whose body is `model` as JSON or one raw page."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}},
                "text/html": {"schema": {"type": "string"}},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            },
        }
    }


def json_body_openapi(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route that reads its JSON body `model` itself."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


def install_openapi(app: FastAPI, *, description: str, body_models: Sequence[type[BaseModel]]) -> None:
    """Build the document once, on first request, with the raw-body routes' models in the components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=description, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in body_models:
            model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(model_schema.pop("$defs", {}))
            components[model.__name__] = model_schema
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
