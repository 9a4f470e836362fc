"""The config-history checker (``tests.history``) passes a history that keeps the API's promises and names the
requests of each broken one."""

from __future__ import annotations

from tests.history import OK, REFUSED, UNKNOWN, Read, Write, violations


def _write(marker: int, sent: float, answered: float, outcome: str = OK, version: int | None = None) -> Write:
    status = {OK: 200, REFUSED: 409, UNKNOWN: 503}[outcome]
    return Write(0, "e", marker, sent, answered, outcome, status, version)


def _read(sent: float, version: int, marker: int | None, pending: tuple[int, int | None] | None = None) -> Read:
    return Read(1, "e", sent, sent + 0.1, version, marker, pending)


def test_a_history_that_keeps_every_promise_passes():
    writes = [
        _write(11, 1.0, 1.1, OK, 2),
        _write(12, 1.05, 1.2, REFUSED),  # lost the race: a 409
        _write(13, 2.0, 2.1, UNKNOWN),  # the gateway died: applied, it turns out
        _write(14, 3.0, 3.1, OK, 4),
    ]
    reads = [_read(1.15, 1, None, (2, 11)), _read(1.5, 2, 11), _read(2.5, 3, 13), _read(3.2, 3, 13, (4, 14))]
    assert violations(writes, reads, {"e": _read(4.0, 4, 14)}) == []


def test_a_lost_acknowledged_update_is_named():
    writes = [_write(11, 1.0, 1.1, OK, 2), _write(12, 2.0, 2.1, OK, 3)]
    found = violations(writes, [], {"e": _read(4.0, 2, 11)})
    assert any("marker 12" in v and "was lost" in v for v in found), found


def test_two_winners_of_one_version_are_named():
    writes = [_write(11, 1.0, 1.2, OK, 2), _write(12, 1.0, 1.2, OK, 2)]
    found = violations(writes, [], {"e": _read(4.0, 2, 12)})
    assert any("version 2 acknowledged to 2 writes" in v for v in found), found


def test_a_refused_write_that_shows_is_named():
    writes = [_write(11, 1.0, 1.1, OK, 2), _write(12, 1.05, 1.2, REFUSED)]
    found = violations(writes, [_read(1.5, 2, 12)], {"e": _read(4.0, 2, 11)})
    assert any("refused" in v and "marker 12" in v for v in found), found


def test_a_read_that_goes_back_or_misses_an_acknowledged_write_is_named():
    writes = [_write(11, 1.0, 1.1, OK, 2)]
    reads = [_read(1.5, 2, 11), _read(2.0, 1, None)]
    found = violations(writes, reads, {"e": _read(4.0, 2, 11)})
    assert any("went back" in v for v in found) and any("does not see" in v for v in found), found
