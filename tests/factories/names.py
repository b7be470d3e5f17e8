"""Names sharing one of Lexbor's hash buckets, for the tests of the name lookup check
(`service.core.precheck.names`)."""

from __future__ import annotations

import functools
import itertools

from service.core.precheck.names import _buckets


def reference_bucket(name: bytes) -> int:
    """Lexbor's `lexbor_hash_make_id` (Jenkins' one-at-a-time), modulo its 128 buckets, written out."""
    mask = 0xFFFFFFFF
    value = 0
    for byte in name:
        value = (value + byte) & mask
        value = (value + (value << 10)) & mask
        value ^= value >> 6
    value = (value + (value << 3)) & mask
    value ^= value >> 11
    value = (value + (value << 15)) & mask
    return value % 128


@functools.cache
def colliding_names(count: int, bucket: int, prefix: bytes = b"") -> tuple[bytes, ...]:
    """`count` lowercase names that hash into `bucket`, each `prefix` and six letters (found with
    `_buckets`, which tests/core/precheck/test_names.py holds to the reference; a sample checked here
    too)."""
    found: list[bytes] = []
    candidates = (
        prefix + bytes(letters) for letters in itertools.product(b"abcdefghijklmnopqrstuvwxyz", repeat=6)
    )
    while len(found) < count:
        batch = list(itertools.islice(candidates, 200_000))
        found += [name for name, hashed in zip(batch, _buckets(batch), strict=True) if hashed == bucket]
    assert all(reference_bucket(name) == bucket for name in found[:: max(1, count // 50)])
    return tuple(found[:count])
