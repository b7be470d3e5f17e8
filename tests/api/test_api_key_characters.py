"""service.api.api_keys and settings: a key is what a client can send, as it will send it.

A non-ASCII `HTMLLM_API_KEY` had started a server whose every request got 401 "the API key is not valid"
(httpx and requests cannot send it; the UTF-8 bytes others send never matched), and one with a trailing
newline (`echo`, `kubectl create secret --from-file`) had kept the newline: a lockout that blamed the key.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from service.api import api_keys
from service.api import main as api_main
from service.api.api_keys import ApiKeys
from service.api.settings import Settings
from service.core.errors import ErrorCode, HtmllmError
from tests.api.conftest import SettingsFactory, app_client
from tests.api.pages import page

UNSENDABLE = ("clé-ключ-🔑", "line\nbreak", "nul\x00", "del\x7f", "esc\x1b")


@pytest.mark.parametrize("value", ["abc\n", "  abc  ", "\tabc\r\n"])
def test_white_space_around_the_key_is_no_part_of_it(value: str) -> None:
    settings = Settings(api_key=value)
    assert settings.api_key is not None and settings.api_key.get_secret_value() == "abc"
    for key in (settings.api_key, SecretStr(value)):  # ApiKeys strips too, for a caller of its own
        keys = ApiKeys(key)
        assert keys.accepts("abc") and not keys.accepts(value)


@pytest.mark.parametrize("value", UNSENDABLE)
def test_a_key_no_client_can_send_is_refused_without_quoting_it(value: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(api_key=value)
    assert "not visible ASCII" in str(refused.value) and value not in str(refused.value)
    with pytest.raises(
        HtmllmError, match="HTMLLM_API_KEY holds a character that is not visible ASCII"
    ) as raw:
        ApiKeys(SecretStr(value))
    assert raw.value.code == ErrorCode.VALIDATION and value not in str(raw.value)


@pytest.mark.parametrize("key", ["crawl team key", "tab\there"])
def test_spaces_and_tabs_inside_a_key_are_part_of_it_as_clients_send_them(key: str) -> None:
    """`Bearer crawl team key` is sent unchanged by httpx, requests and curl and read back whole: such
    keys worked before keys were checked, and an upgraded server had refused to start with one."""
    keys = ApiKeys(Settings(api_key=f" {key}\n").api_key)
    assert keys.accepts(key) and not keys.accepts(key.replace(" ", "").replace("\t", ""))


def test_every_visible_ascii_character_may_be_in_a_key() -> None:
    key = "".join(chr(c) for c in range(0x21, 0x7F))
    assert ApiKeys(Settings(api_key=key).api_key).accepts(key)


def test_an_empty_key_is_a_settings_error() -> None:
    with pytest.raises(ValidationError, match="is empty"):
        Settings(api_key=" \n")


def test_serve_refuses_it_in_one_settings_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settings' error path (one line per setting, exit 2), before the model is looked for."""
    key = UNSENDABLE[0]
    monkeypatch.setenv("HTMLLM_API_KEY", key)
    assert api_main.main(["--model-path", str(tmp_path / "no-model"), "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("htmllm serve: invalid settings: HTMLLM_API_KEY: holds a character that is not")
    assert err.count("\n") == 1 and key not in err and "ключ" not in err


def test_a_key_file_line_no_client_can_send_is_named_by_number(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    secret = "ключ-key"
    path.write_text(f"# keys\ngood-key\n{secret}\n", encoding="utf-8")
    with pytest.raises(HtmllmError, match=r"HTMLLM_API_KEY_FILE .* line 3: the key holds") as refused:
        ApiKeys(key_file=path)
    assert refused.value.code == ErrorCode.VALIDATION and secret not in str(refused.value)
    path.write_text("good-key\n  other-key \r\n", encoding="utf-8")  # white space around a line: stripped
    keys = ApiKeys(key_file=path)
    assert keys.accepts("good-key") and keys.accepts("other-key")


def test_a_changed_key_file_with_a_bad_line_keeps_the_keys_read_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(api_keys, "RECHECK_INTERVAL_S", 0.0)
    path = tmp_path / "keys"
    path.write_text("old-key\n", encoding="utf-8")
    keys = ApiKeys(key_file=path)
    new = path.with_name("keys.new")
    new.write_text("old-key\nnew-k\u00e9y\n", encoding="utf-8")
    os.replace(new, path)
    with caplog.at_level(logging.WARNING, logger="service.api.api_keys"):
        assert keys.accepts("old-key") and not keys.accepts("new-k\u00e9y")
    assert (
        "line 2" in caplog.text
        and "keeping the 1 key(s)" in caplog.text
        and "new-k\u00e9y" not in caplog.text
    )


def test_the_header_is_compared_as_the_bytes_sent() -> None:
    """ASGI servers decode header values as latin-1: the presented key is encoded back so (it had been
    encoded as UTF-8), and a string no header decodes to matches nothing rather than raising."""
    keys = ApiKeys(SecretStr("k1"))
    assert keys.accepts("k1") and not keys.accepts("k1\u00e9") and not keys.accepts("🔑")


async def test_a_key_with_a_trailing_newline_opens_the_routes(settings_for: SettingsFactory) -> None:
    body = {"documents": [{"html": page(1)}]}
    async with app_client(settings_for(api_key="s3cret\n")) as client:
        ok = await client.post("/v1/embed", json=body, headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200, ok.text
        missing = await client.post("/v1/embed", json=body)
        assert missing.status_code == 401
