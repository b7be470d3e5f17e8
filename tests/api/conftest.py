"""Fixtures for the API tests: a tiny checkpoint, settings for it, and an in-process client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from service.api.app import create_app
from service.api.settings import Settings
from tests.factories.checkpoint import build_tiny_checkpoint

SettingsFactory = Callable[..., Settings]


@pytest.fixture(autouse=True)
def _no_htmllm_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Settings read HTMLLM_* variables; the developer's own must not leak into the tests."""
    import os

    for name in list(os.environ):
        if name.startswith("HTMLLM_"):
            monkeypatch.delenv(name)
    yield


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("api") / "tiny")


def tiny_settings(checkpoint: Path, **overrides: Any) -> Settings:
    """Settings for `checkpoint` on 127.0.0.1, every field the tests rely on given explicitly."""
    values: dict[str, Any] = {
        "model_path": checkpoint,
        "host": "127.0.0.1",
        "port": 0,
        "preprocess_workers": 1,
        "preprocess_pool": "thread",  # the default is processes: one per test server would cost minutes
        "extract_workers": 1,
        "api_key": None,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
def settings_for(tiny_checkpoint: Path) -> SettingsFactory:
    """Settings for the tiny checkpoint, with any field overridden."""

    def make(**overrides: Any) -> Settings:
        return tiny_settings(tiny_checkpoint, **overrides)

    return make


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """`app` in-process with its lifespan run, behind an httpx client; readiness is the caller's business."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield client


@asynccontextmanager
async def app_client(settings: Settings, *, wait_ready: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """The app in-process (lifespan run, model warmed), behind an httpx client."""
    async with serving(create_app(settings)) as client:
        if wait_ready:
            for _ in range(600):
                if (await client.get("/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.01)
            else:
                raise TimeoutError("the app did not become ready")
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_checkpoint: Path) -> AsyncIterator[httpx.AsyncClient]:
    """One app per module with the default limits (tests that need other settings make their own)."""
    async with app_client(tiny_settings(tiny_checkpoint)) as c:
        yield c
