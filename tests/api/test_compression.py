"""`Accept-Encoding` negotiation for gzipped responses (service/api/compression.py)."""

from __future__ import annotations

import pytest

from service.api.compression import accepts_gzip


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        ("gzip", True),
        ("GZip", True),
        ("gzip, deflate, br", True),
        ("br;q=1.0, gzip;q=0.8, *;q=0.1", True),
        ("x-gzip", True),
        ("gzip ; q=0.5", True),
        ("gzip;q=0", False),
        ("gzip;q=0.000", False),
        ("gzip; Q=0", False),
        ("br, gzip;q=0", False),
        ("gzip;q=0, x-gzip;q=0.5", True),
        ("gzip;q=nonsense", False),
        ("gzip;q=2", False),
        ("gzip;q=nan", False),
        ("identity", False),
        ("", False),
        ("*", False),
        ("deflate, br", False),
        ("notgzip", False),
    ],
)
def test_accepts_gzip_reads_weights(header: str, accepted: bool) -> None:
    assert accepts_gzip(header) is accepted
