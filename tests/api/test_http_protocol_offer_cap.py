"""service/api/http_protocol.py: a head that offers to switch protocols is held to the cap as it was sent.

llhttp stops at the end of such a head, and the head is parsed again, without the offer, by a fresh
parser, which holds it to `MAX_HEAD_BYTES` again. It was written again as `name: value`, a byte a field
more than a head sent as `name:value`, so a valid head within the cap got a 431.
"""

from __future__ import annotations

import re

import pytest

from service.api.http_protocol import MAX_HEAD_BYTES
from tests.api.protocol_harness import echo_app, protocol_on_fake_transport
from tests.factories.waiting import until_async

_BODY = b'{"ids":[[101,102]]}'


def _head(size: int, offer: bytes) -> bytes:
    """A POST's head of exactly `size` bytes as sent, `offer` among its fields, every field written
    without a space after its colon (as t3.py of the review wrote them: 40-byte fields)."""
    start = b"POST /decode HTTP/1.1\r\nHost:a\r\n" + offer + b"Content-Length:%d\r\n" % len(_BODY)
    fields = []
    left = size - len(start) - 2
    while left > 0:
        length = 40 if left >= 49 or left == 40 else left
        fields.append(b"a:" + b"b" * (length - 4) + b"\r\n")
        left -= length
    head = start + b"".join(fields) + b"\r\n"
    assert len(head) == size
    return head


_OFFERS = {
    "h2c": b"Connection:close, Upgrade\r\nUpgrade:h2c\r\n",
    "h2c-settings": (
        b"Connection:Upgrade,HTTP2-Settings\r\nUpgrade:h2c\r\nHTTP2-Settings:AAMAAABkAAQCAAAAAAIAAAAA\r\n"
    ),
    "websocket": b"Connection:keep-alive,Upgrade\r\nUpgrade:websocket\r\nSec-WebSocket-Version:13\r\n",
}


@pytest.mark.parametrize("offer", list(_OFFERS), ids=list(_OFFERS))
@pytest.mark.parametrize("size", [40000, MAX_HEAD_BYTES], ids=["40000", "at-the-cap"])
async def test_a_head_within_the_cap_that_offers_a_switch_is_served(offer: str, size: int) -> None:
    """A head of up to `MAX_HEAD_BYTES` bytes as sent is served with its body, offer or not, whatever
    whitespace its fields have after their colons (none here: the head given again had one more byte a
    field, and one over 60,000 bytes got a 431)."""
    protocol, transport = protocol_on_fake_transport(echo_app, head_timeout_s=60.0)
    protocol.data_received(_head(size, _OFFERS[offer]) + _BODY)
    await until_async(lambda: b"HTTP/1.1 " in transport.written, "the request answered")
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", transport.written) == [b"200"], transport.written[:300]
    assert transport.written.endswith(b"\r\n\r\n" + _BODY)


async def test_a_head_over_the_cap_that_offers_a_switch_is_a_431() -> None:
    """The head given again is no longer than as sent: one over the cap is refused still."""
    protocol, transport = protocol_on_fake_transport(echo_app, head_timeout_s=60.0)
    protocol.data_received(_head(MAX_HEAD_BYTES + 1, _OFFERS["h2c"]) + _BODY)
    await until_async(lambda: b"HTTP/1.1 " in transport.written, "the request answered")
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", transport.written) == [b"431"], transport.written[:300]
