"""A record whose WARC header has no WARC-Type field (WARC requires one: a byte of the field's name
flipped, which a plain .warc keeps no checksum to tell) is its own error row, named by its id and byte,
and the records after it are read. FastWARC reads it as a record of an unknown type, and it had vanished
with no row, a page among them."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.core.errors import ErrorCode
from tests.factories.warc import HttpResponse, pages_and_errors, response, warc_record

COUNT = 4


def _records() -> list[bytes]:
    return [
        response(f"r{i}", HttpResponse(f"<p>page {i}</p>".encode() * 20), uri=f"https://example.com/{i}")
        for i in range(COUNT)
    ]


@pytest.mark.parametrize("name", [b"WARC-Tyqe", b"WARC Type", b"WARC-Typ\x00", b"WARC-Type\x00"])
def test_a_record_whose_warc_type_name_is_damaged_is_an_error_row(tmp_path: Path, name: bytes) -> None:
    records = _records()
    records[1] = records[1].replace(b"WARC-Type", name, 1)
    path = tmp_path / "crawl.warc"
    path.write_bytes(b"".join(records))

    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == ["<urn:uuid:r0>", "<urn:uuid:r2>", "<urn:uuid:r3>"]
    assert [(p.id, p.url, p.error_code) for p in errors] == [
        ("<urn:uuid:r1>", "https://example.com/1", ErrorCode.VALIDATION)
    ]
    assert f"at byte {len(records[0])} has no WARC-Type field" in (errors[0].error or "")


def test_an_untyped_record_without_an_id_is_named_by_its_byte(tmp_path: Path) -> None:
    records = _records()
    untyped = warc_record("x", b"<p>untyped</p>", record_type="resource", content_type="text/html")
    untyped = untyped.replace(b"WARC-Type", b"WARC-Tyqe", 1).replace(b"WARC-Record-ID", b"X-Record-ID", 1)
    path = tmp_path / "crawl.warc"
    path.write_bytes(records[0] + untyped + records[1])

    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == ["<urn:uuid:r0>", "<urn:uuid:r1>"]
    assert [p.id for p in errors] == [f"crawl.warc@{len(records[0])}"]


def test_a_record_of_a_type_warc_does_not_define_is_still_passed_over(tmp_path: Path) -> None:
    """An extension's WARC-Type is no damage: such a record is no page, and no row, as before."""
    records = _records()
    other = warc_record("x", b"data", record_type="x-custom", content_type="application/octet-stream")
    path = tmp_path / "crawl.warc"
    path.write_bytes(records[0] + other + records[1])

    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == ["<urn:uuid:r0>", "<urn:uuid:r1>"] and errors == []


def test_a_file_cut_inside_a_header_still_has_one_row(tmp_path: Path) -> None:
    """FastWARC hands back an empty record, with no WARC-Type, for a file cut inside a header: that is
    the walk of the file's end's row alone, not a second one for an untyped record."""
    records = _records()
    path = tmp_path / "crawl.warc"
    path.write_bytes(records[0] + records[1][:14])

    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == ["<urn:uuid:r0>"]
    assert len(errors) == 1 and "WARC-Type" not in (errors[0].error or "")
