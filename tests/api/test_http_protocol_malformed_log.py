"""Bytes that are no HTTP/1.1 request are logged once a minute for all connections, not once each: a
scanner or a TLS client on the plain port sends them by the thousand, and each had been a warning."""

from __future__ import annotations

import asyncio
import logging

import pytest

from service.api.http_protocol import protocol_class
from tests.api.protocol_harness import echo_app, protocol_on_fake_transport


async def test_a_flood_of_malformed_requests_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    protocol_type = protocol_class(None)
    # Five connections, as five scanner probes; made first: each uvicorn.Config sets its loggers' handlers.
    connections = [protocol_on_fake_transport(echo_app, protocol_type=protocol_type) for _ in range(5)]
    logger = logging.getLogger("uvicorn.error")  # (uvicorn's loggers do not propagate to caplog's root)
    logger.addHandler(caplog.handler)
    try:
        for protocol, transport in connections:
            protocol.data_received(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http\r\n\r\n")
            await asyncio.sleep(0)
            assert b" 400 " in bytes(transport.written)
    finally:
        logger.removeHandler(caplog.handler)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "Invalid HTTP" in r.message]
    assert len(warnings) == 1, [r.message for r in warnings]
