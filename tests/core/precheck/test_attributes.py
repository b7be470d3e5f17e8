"""The attribute pre-check (`max_attributes`) against a brute-force count of every long tag."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

from service.core.precheck import attributes

REPO = Path(__file__).resolve().parents[3]


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


def test_attribute_count_matches_the_names_left_once_values_are_blanked() -> None:
    """The stretch-by-stretch count against the plain definition: the names `ATTRIBUTE_NAME` finds
    after `ATTRIBUTE_VALUE` blanks every value, on random tags of names, values and separators."""
    pieces = [b"a", b"b1", b"x-y", b" ", b"\t", b"/", b"=", b"= ", b'="v w"', b"='q'", b"=u>", b'"', b"'"]
    rng = random.Random(1)
    for _ in range(3000):
        tag = b"<" + rng.choice([b"div", b"a", b""]) + b"".join(rng.choices(pieces, k=rng.randint(0, 30)))
        rest = tag[m.end() if (m := attributes.ATTRIBUTE_NAME.match(tag)) else 0 :]
        plain = len(attributes.ATTRIBUTE_NAME.findall(attributes.ATTRIBUTE_VALUE.sub(b" ", rest)))
        assert attributes.attribute_count(tag) == plain, tag


def test_counting_a_million_attributes_holds_nothing_per_attribute() -> None:
    """A tag of a million attributes (the page `max_attributes` refuses) is counted without a list of
    its names or of `sub`'s pieces: those peaked 240 MB over a 10 MB page, past the page's memory bound
    (10x its size + 200 MB) once the parse's own share was added. Run apart: its peak is its own."""
    code = (
        "import json\n"
        "from service.core.precheck.attributes import max_attributes\n"
        'data = b"<div " + b" ".join(b"a%d=v" % i for i in range(1_000_000)) + b">t</div>"\n'
        "def vm(key):\n"
        '    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))\n'
        "    return int(line.split()[1]) * 1024\n"
        'open("/proc/self/clear_refs", "w").write("5")  # (the peak from here on)\n'
        'before = vm("VmRSS")\n'
        "count = max_attributes(data)\n"
        'print(json.dumps({"count": count, "grew": vm("VmHWM") - before, "size": len(data)}))\n'
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["count"] == 1_000_000
    assert outcome["grew"] < 3 * outcome["size"], outcome  # (was about 24x: 240 MB)
