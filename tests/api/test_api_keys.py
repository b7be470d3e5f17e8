"""service.api.api_keys: HTMLLM_API_KEY and HTMLLM_API_KEY_FILE, and rotating keys without a restart."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from pydantic import SecretStr

from service.api import api_keys
from service.api import main as api_main
from service.api.api_keys import ApiKeys
from service.api.settings import Settings
from service.core.errors import ErrorCode, HtmllmError
from tests.api.conftest import SettingsFactory, app_client
from tests.api.pages import page


@pytest.fixture
def recheck_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Look at the key file on every request (the server waits a second between looks)."""
    monkeypatch.setattr(api_keys, "RECHECK_INTERVAL_S", 0.0)


def swap(path: Path, text: str) -> None:
    """Replace the file the way the kubelet updates a mounted Secret: a new file renamed over the old."""
    new = path.with_name(path.name + ".new")
    new.write_text(text, encoding="utf-8")
    os.replace(new, path)


def test_no_key_no_auth() -> None:
    keys = ApiKeys()
    assert not keys.enabled and not keys.accepts("")


def test_the_fixed_key_and_the_file_keys_are_all_accepted(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# rotation: new key first\nnew-key\n\n  old-key  \n", encoding="utf-8")
    keys = ApiKeys(SecretStr("env-key"), path)
    assert keys.enabled
    assert all(keys.accepts(k) for k in ("env-key", "new-key", "old-key"))
    assert not any(keys.accepts(k) for k in ("", "new", "new-key\nold-key", "# rotation: new key first"))


@pytest.mark.usefixtures("recheck_always")
def test_a_changed_file_is_read_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "keys"
    path.write_text("old-key\n", encoding="utf-8")
    keys = ApiKeys(key_file=path)
    swap(path, "old-key\nnew-key\n")  # step 1: both work while the clients move over
    assert keys.accepts("old-key") and keys.accepts("new-key")
    with caplog.at_level(logging.INFO, logger="service.api.api_keys"):
        swap(path, "new-key\n")  # step 2: the old key is retired
        assert keys.accepts("new-key") and not keys.accepts("old-key")
    assert "2 key(s)" not in caplog.text and "1 key(s)" in caplog.text
    assert "new-key" not in caplog.text  # a change is logged, never a key


@pytest.mark.usefixtures("recheck_always")
def test_a_file_that_disappears_keeps_the_keys_and_an_empty_one_accepts_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys"
    path.write_text("k1\n", encoding="utf-8")
    keys = ApiKeys(key_file=path)
    path.unlink()  # a Secret being re-mounted: neither lock everyone out nor open the door
    with caplog.at_level(logging.WARNING, logger="service.api.api_keys"):
        assert keys.accepts("k1") and not keys.accepts("k2")
    assert "cannot be read" in caplog.text and "keeping the 1 key(s)" in caplog.text
    path.write_text("# every key revoked\n", encoding="utf-8")
    assert not keys.accepts("k1") and keys.enabled  # auth stays on: no key opens it
    path.write_text("k2\n", encoding="utf-8")
    assert keys.accepts("k2")


@pytest.mark.usefixtures("recheck_always")
def test_an_emptied_file_still_leaves_the_fixed_key_and_the_log_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """HTMLLM_API_KEY and the file's keys are additive: emptying the file revokes its keys only. The log
    said `every model request gets 401` while the fixed key was still accepted."""
    both, alone = tmp_path / "both", tmp_path / "alone"
    for path in (both, alone):
        path.write_text("file-key\n", encoding="utf-8")
    with_fixed, file_only = ApiKeys(SecretStr("env-key"), both), ApiKeys(key_file=alone)
    with caplog.at_level(logging.WARNING, logger="service.api.api_keys"):
        swap(both, "# every file key revoked\n")
        assert with_fixed.accepts("env-key") and not with_fixed.accepts("file-key")
    assert "holds no key: only HTMLLM_API_KEY is accepted" in caplog.text and "gets 401" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="service.api.api_keys"):
        swap(alone, "# every file key revoked\n")
        assert not file_only.accepts("file-key") and not file_only.accepts("env-key")
    assert "holds no key: every model request gets 401" in caplog.text


def test_the_file_is_not_looked_at_on_every_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "keys"
    path.write_text("k1\n", encoding="utf-8")
    keys = ApiKeys(key_file=path)
    stats = []
    real_stat = os.stat
    monkeypatch.setattr(api_keys.os, "stat", lambda p: stats.append(p) or real_stat(p))
    for _ in range(100):
        assert keys.accepts("k1")
    assert len(stats) <= 1


def test_an_unusable_key_file_or_an_empty_key_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(HtmllmError, match="cannot be read") as missing:
        ApiKeys(key_file=tmp_path / "nothing")
    assert missing.value.code == ErrorCode.VALIDATION
    empty = tmp_path / "empty"
    empty.write_text("# no key yet\n\n", encoding="utf-8")
    with pytest.raises(HtmllmError, match="holds no key, and HTMLLM_API_KEY is not set"):
        ApiKeys(key_file=empty)  # no key could ever open the model routes
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00k")
    with pytest.raises(HtmllmError, match="cannot be read"):
        ApiKeys(key_file=binary)
    with pytest.raises(HtmllmError, match="HTMLLM_API_KEY is empty"):
        ApiKeys(SecretStr(" "))


@pytest.mark.usefixtures("recheck_always")
def test_a_key_file_emptied_mid_rotation_starts_with_the_fixed_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A pod restarted while the file holds no key starts as its running peers serve: with HTMLLM_API_KEY
    alone (docs/deployment.md, "Rotating the API key"). The start had refused it (exit 2), so a restart
    during the rotation took the pod down where the others went on serving."""
    path = tmp_path / "keys"
    path.write_text("# every file key revoked\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="service.api.api_keys"):
        keys = ApiKeys(SecretStr("env-key"), path)
    assert "holds no key: only HTMLLM_API_KEY is accepted" in caplog.text
    assert keys.enabled and keys.accepts("env-key") and not keys.accepts("new-key")
    swap(path, "new-key\n")  # the rotation goes on: the file's keys are read as on a running server
    assert keys.accepts("new-key") and keys.accepts("env-key")


async def test_the_app_serves_with_an_empty_key_file_and_the_fixed_key(
    settings_for: SettingsFactory, tmp_path: Path
) -> None:
    path = tmp_path / "keys"
    path.write_text("# none\n", encoding="utf-8")
    body = {"documents": [{"html": page(1)}]}
    async with app_client(settings_for(api_key="env-key", api_key_file=path)) as client:
        for key, status in (("env-key", 200), ("file-key", 401)):
            headers = {"authorization": f"Bearer {key}"}
            assert (await client.post("/v1/embed", json=body, headers=headers)).status_code == status, key


def test_serve_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(model_path=tmp_path, api_key_file=tmp_path / "nothing")
    assert api_main.serve(settings) == 2  # a setting that cannot work, as a bad HTMLLM_API_KEY
    err = capsys.readouterr().err
    assert err.startswith("htmllm serve: invalid settings: HTMLLM_API_KEY_FILE") and err.count("\n") == 1


@pytest.mark.usefixtures("recheck_always")
async def test_routes_follow_the_key_file(settings_for: SettingsFactory, tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("old-key\n", encoding="utf-8")
    body = {"documents": [{"html": page(1)}]}
    async with app_client(settings_for(api_key_file=path)) as client:
        assert (await client.get("/info")).json()["auth"] is True
        assert (await client.post("/v1/embed", json=body)).status_code == 401

        async def status(key: str) -> int:
            response = await client.post("/v1/embed", json=body, headers={"authorization": f"Bearer {key}"})
            return response.status_code

        assert await status("old-key") == 200 and await status("new-key") == 401
        swap(path, "old-key\nnew-key\n")
        assert await status("old-key") == 200 and await status("new-key") == 200
        swap(path, "new-key\n")
        assert await status("old-key") == 401 and await status("new-key") == 200
        for route in ("/health", "/ready", "/metrics"):
            assert (await client.get(route)).status_code == 200, route
