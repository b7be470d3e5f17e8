"""The attribute pre-check (`max_attributes`) against a brute-force count of every long tag."""

from __future__ import annotations

import random
import re

from service.core.precheck import attributes


def test_attribute_count_check_finds_every_long_tag() -> None:
    def brute_force(doc: str) -> int:
        long_tags = (
            m.group() for m in re.finditer(r"<div[^>]*", doc) if len(m.group()) >= attributes._LONG_TAG_CHARS
        )
        return max((len(tag.split()) - 1 for tag in long_tags), default=0)

    rng = random.Random(0)
    for _ in range(100):
        doc = "".join(
            "x" * rng.randint(0, 9000)
            + "<div "
            + " ".join(f"a{i}" for i in range(rng.choice([0, 10, 3000, 4500])))
            + ">"
            + "t" * rng.randint(0, 5000)
            for _ in range(rng.randint(1, 5))
        )
        assert attributes.max_attributes(doc) == brute_force(doc) == attributes.max_attributes(doc.encode())
