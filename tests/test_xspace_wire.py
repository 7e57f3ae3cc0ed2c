"""The XSpace reader's wire decoding (numpy over each line's serialized events) against protobuf's own parser.

``fitprof.traces._xspace_events.decode_events`` reads the events of a line from their bytes;
``_message_events`` reads the same events from the messages protobuf parsed, one attribute at a time (the
reader's fallback, and the reference here). Both must give the same columns and stat values on random events
(random ids, negative and 64-bit values, the ``offset_ps`` / ``num_occurrences`` oneof, every stat value type,
repeated and unknown fields, fields with the wrong wire type), and whole files must give the same table through
either path. Damaged events make the decoder give up, and the reader then answers as protobuf does.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import gputrace
from fitprof.traces import TraceError, read_trace
from fitprof.traces import _xplane_schema as xs
from fitprof.traces import _xspace_events as xspace_events
from fitprof.traces.xspace_write import kineto_to_xspace
from fuzz_traces import kineto_seed
from shared_fixtures import KERAS_XSPACE, LIGHTNING_CPU

SEEDS = range(12)


def _field(number: int, wire: int, payload: bytes | int) -> bytes:
    tag = gputrace.varint(number << 3 | wire)
    if wire == 0:
        assert isinstance(payload, int)
        return tag + gputrace.varint(payload)
    assert isinstance(payload, bytes)
    return tag + (gputrace.varint(len(payload)) + payload if wire == 2 else payload)


def _random_int(rng: random.Random) -> int:
    return rng.choice([0, 1, 127, 128, 300, 2**31, 2**53 + 1, 2**63 - 1, -1, -(2**63), rng.randrange(-(2**40), 2**40)])


def _random_stat(rng: random.Random) -> bytes:
    """An ``XStat``'s bytes: a metadata id, zero or more values (the last one set wins), maybe unknown fields."""
    parts = [_field(1, 0, rng.randrange(0, 8))] if rng.random() < 0.9 else []
    for _ in range(rng.choice([0, 1, 1, 1, 2])):
        kind = rng.randrange(2, 8)
        if kind == 2:
            value = rng.choice([0.5, -0.0, 1e300, float("nan"), float("inf"), rng.random()])
            parts.append(_field(2, 1, struct.pack("<d", value)))
        elif kind in (3, 7):
            parts.append(_field(kind, 0, rng.randrange(0, 2**64)))
        elif kind == 4:
            parts.append(_field(4, 0, _random_int(rng)))
        elif kind == 5:
            parts.append(_field(5, 2, rng.choice(["", "gpu_memcpy", "aten::mm", "é→中", "x" * 70]).encode()))
        else:
            parts.append(_field(6, 2, bytes(rng.randrange(256) for _ in range(rng.randrange(4)))))
    if rng.random() < 0.2:
        parts.append(_unknown(rng))
    rng.shuffle(parts)
    return b"".join(parts)


def _unknown(rng: random.Random) -> bytes:
    """A field the schema does not have (or a known one with another wire type): skipped by both readers."""
    number = rng.choice([9, 15, 16, 2047, 1 << 20])
    wire = rng.choice([0, 1, 2, 5])
    payload: bytes | int = (
        rng.randrange(2**64)
        if wire == 0
        else bytes(rng.randrange(256) for _ in range(8 if wire == 1 else 4 if wire == 5 else rng.randrange(5)))
    )
    return _field(number, wire, payload)


def _random_event(rng: random.Random) -> bytes:
    """An ``XEvent``'s bytes, fields in any order, some repeated, some unknown, some with the wrong wire type."""
    parts = []
    for _ in range(rng.randrange(0, 3)):
        parts.append(_field(1, 0, rng.randrange(0, 12)))
    for _ in range(rng.randrange(0, 3)):
        parts.append(_field(rng.choice([2, 2, 5]), 0, _random_int(rng)))  # offset_ps / num_occurrences
    for _ in range(rng.randrange(0, 2)):
        parts.append(_field(3, 0, _random_int(rng)))
    if rng.random() < 0.1:
        parts.append(_field(1, 2, b"xy"))  # metadata_id as bytes: an unknown field to protobuf
    if rng.random() < 0.1:
        parts.append(_unknown(rng))
    rng.shuffle(parts)  # scalar fields in any order; stats keep their relative order below
    stats = [_field(4, 2, _random_stat(rng)) for _ in range(rng.randrange(0, 4))]
    for s in stats:
        parts.insert(rng.randrange(len(parts) + 1), s)
    return b"".join(parts)


def _raw_line(events: list[bytes]) -> Any:
    line = xs.xplane_raw_classes()["XLine"]()
    line.events.extend(events)
    return line


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    return len(a) == len(b) and all(
        type(x) is type(y) and (x == y or (isinstance(x, float) and np.isnan(x) and np.isnan(y)))
        for x, y in zip(a.tolist(), b.tolist(), strict=True)
    )


def _assert_same_events(got: xspace_events.Events, want: xspace_events.Events) -> None:
    for col in ("line", "metadata_id", "offset_ps", "duration_ps", "stat_event", "stat_id", "stat_kind"):
        np.testing.assert_array_equal(getattr(got, col), getattr(want, col), err_msg=col)
    idx = np.arange(len(want.stat_id))
    assert _same_values(got.values(idx), want.values(idx))


@pytest.mark.parametrize("seed", SEEDS)
def test_decoded_events_equal_protobufs_on_random_events(seed: int) -> None:
    rng = random.Random(seed)
    lines = [[_random_event(rng) for _ in range(rng.randrange(0, 60))] for _ in range(4)]
    with_stats = [True, False, True, True]
    got = xspace_events.decode_events([_raw_line(evs).events for evs in lines], with_stats)
    assert got is not None
    full = xs.xplane_classes()["XLine"]
    want = xspace_events.message_events(
        [full.FromString(_raw_line(evs).SerializeToString()) for evs in lines], with_stats
    )
    _assert_same_events(got, want)
    assert len(got.metadata_id) == sum(map(len, lines))
    # Lines read without stats give none: their stats are never decoded.
    assert not np.isin(got.stat_event, np.flatnonzero(got.line == 1)).any()


@pytest.mark.parametrize("seed", SEEDS)
def test_fields_equal_a_byte_by_byte_walk(seed: int) -> None:
    """decode_fields against the plain loop over the wire format (the protobuf encoding spec, one field at a time)."""
    rng = random.Random(1000 + seed)
    messages = [_random_event(rng) if rng.random() < 0.7 else _random_stat(rng) for _ in range(200)]
    blob = b"".join(messages) + bytes(xs.WIRE_PAD)
    ends = np.cumsum([len(m) for m in messages])
    f = xs.decode_fields(np.frombuffer(blob, np.uint8), ends - [len(m) for m in messages], ends)
    assert f is not None
    want = [row for i, m in enumerate(messages) for row in _walk(m, i, int(ends[i]) - len(m))]
    got = list(zip(f.msg.tolist(), f.number.tolist(), f.wire.tolist(), f.value.tolist(), f.at.tolist(), strict=True))
    assert got == want


def _walk(message: bytes, index: int, offset: int) -> list[tuple[int, int, int, int, int]]:
    def varint(pos: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            b = message[pos]
            value |= (b & 0x7F) << shift
            shift += 7
            pos += 1
            if b < 0x80:
                return value & ((1 << 64) - 1), pos

    out, pos = [], 0
    while pos < len(message):
        tag, pos = varint(pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, after = varint(pos)
            at = pos
        elif wire == 1:
            value, at, after = int.from_bytes(message[pos : pos + 8], "little"), pos, pos + 8
        elif wire == 5:
            value, at, after = int.from_bytes(message[pos : pos + 4], "little"), pos, pos + 4
        else:
            value, at = varint(pos)
            after = at + value
        out.append((index, number, wire, value, offset + at))
        pos = after
    return out


@pytest.mark.parametrize(
    ("label", "event"),
    [
        ("truncated varint", b"\x08\xff"),
        ("varint of 11 bytes", b"\x08" + b"\xff" * 10 + b"\x01"),
        ("length past the end", b"\x22\x05\x08\x01"),
        ("field number 0", b"\x00\x01"),
        ("group", b"\x0b\x0c"),
        ("wire type 7", b"\x0f"),
        ("stat cut short", b"\x22\x02\x10\xff"),
    ],
)
def test_the_decoder_gives_up_on_what_it_does_not_read(label: str, event: bytes) -> None:
    assert xspace_events.decode_events([_raw_line([b"\x08\x01", event]).events], [True]) is None, label


def _xspace_with(tmp_path: Path, events: list[bytes], name: str = "h.xplane.pb") -> Path:
    """A TF XSpace whose host line ``python`` holds ``events`` after a step marker."""
    space = xs.xplane_raw_classes()["XSpace"]()
    plane = space.planes.add(id=1, name="/host:CPU")
    plane.event_metadata[1].name = "train"
    plane.stat_metadata[1].name = "step_num"
    plane.stat_metadata[2].name = "tf_op"
    line = plane.lines.add(id=1, name="python", timestamp_ns=1000)
    line.events.append(_field(1, 0, 1) + _field(3, 0, 5_000_000) + _field(4, 2, _field(1, 0, 1) + _field(4, 0, 3)))
    line.events.extend(events)
    path = tmp_path / name
    path.write_bytes(space.SerializeToString())
    return path


NOT_UTF8_TF_OP = _field(4, 2, _field(1, 0, 2) + _field(5, 2, b"\xff\xfe"))
"""A ``tf_op`` stat (metadata id 2 in :func:`_xspace_with`) whose string is not UTF-8."""


@pytest.mark.parametrize("event", [b"\x08\xff", b"\x22\x05\x08\x01", NOT_UTF8_TF_OP])
def test_damaged_events_give_protobufs_error(tmp_path: Path, event: bytes) -> None:
    path = _xspace_with(tmp_path, [b"\x08\x01" + event])
    with pytest.raises(
        TraceError, match=r"h\.xplane\.pb: not an XSpace protobuf \(DecodeError: .*fitprof\.xplane\.XSpace"
    ):
        read_trace(path)


def test_what_is_not_read_is_not_checked(tmp_path: Path) -> None:
    """The reader decodes only the stats it reads, on the lines it reads: damage elsewhere no longer makes the
    whole file unreadable (protobuf's full parse refused it)."""
    not_read = _field(4, 2, _field(1, 0, 7) + _field(5, 2, b"\xff\xfe"))  # stat id 7: no stat the rules read
    path = _xspace_with(tmp_path, [b"\x08\x01" + not_read])
    with pytest.raises(Exception, match="bad UTF-8"):
        xs.xplane_classes()["XSpace"].FromString(path.read_bytes())
    assert read_trace(path)["kind"].tolist() == ["step", "other"]


def test_a_group_protobuf_skips_is_read_event_by_event(tmp_path: Path) -> None:
    plain = read_trace(_xspace_with(tmp_path, [_field(1, 0, 1) + _field(3, 0, 7)], "a.xplane.pb"))
    grouped = read_trace(_xspace_with(tmp_path, [_field(1, 0, 1) + b"\x5b\x5c" + _field(3, 0, 7)], "b.xplane.pb"))
    assert len(plain) == 2 and plain.drop(columns=[]).equals(grouped)
    assert plain["step_num"].tolist()[0] == 3.0


def _files(tmp_path: Path) -> list[Path]:
    out = [KERAS_XSPACE]
    for seed in range(3):
        data, _ = gputrace.xspace_trace(seed=seed, steps=3 + seed)
        out.append(tmp_path / f"gpu{seed}.xplane.pb")
        out[-1].write_bytes(data)
    for name, trace in (("lightning", LIGHTNING_CPU), ("seed", kineto_seed())):
        out.append(tmp_path / f"{name}.xplane.pb")
        out[-1].write_bytes(kineto_to_xspace(trace, host="h").SerializeToString())
    return out


def test_tables_equal_through_the_event_by_event_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file gives the same table (bit for bit) whether its events are decoded by numpy or read from
    protobuf's messages one by one (the decoder forced to give up)."""
    files = _files(tmp_path)
    fast = [read_trace(p) for p in files]
    monkeypatch.setattr(xspace_events, "decode_events", lambda raw, with_stats: None)
    slow = [read_trace(p) for p in files]
    for path, a, b in zip(files, fast, slow, strict=True):
        assert len(a) > 0, path
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        assert a.attrs == b.attrs


def test_varints_of_every_size() -> None:
    """The word-at-a-time varint reader against the byte-by-byte one and the encoder, for every size (1 to 10
    bytes, the 8-byte word's edge included) at every alignment."""
    rng = random.Random(7)
    values = [0, 1, 127, 128, 2**56 - 1, 2**56, 2**63, 2**64 - 1]
    values += [rng.randrange(2 ** (7 * k), 2 ** min(64, 7 * (k + 1))) for k in range(10) for _ in range(50)]
    rng.shuffle(values)
    blob = b"".join(gputrace.varint(v) for v in values)
    pos = np.cumsum([0] + [len(gputrace.varint(v)) for v in values[:-1]])
    buf = np.frombuffer(blob + bytes(xs.WIRE_PAD), np.uint8)
    got = xs._varints(buf, pos)
    assert got is not None
    assert got[0].tolist() == values
    assert got[1].tolist() == [len(gputrace.varint(v)) for v in values]
    slow = xs._long_varints(buf, pos)
    assert slow is not None and slow[0].tolist() == values


def _one_line_xspace(tmp_path: Path, events: list[bytes], name: str) -> Path:
    """A TF XSpace whose only host line holds exactly ``events`` (no step marker added)."""
    space = xs.xplane_raw_classes()["XSpace"]()
    plane = space.planes.add(id=1, name="/host:CPU")
    plane.event_metadata[1].name = "train"
    plane.stat_metadata[1].name = "step_num"
    line = plane.lines.add(id=1, name="python", timestamp_ns=1000)
    line.events.extend(events)
    path = tmp_path / name
    path.write_bytes(space.SerializeToString())
    return path


@pytest.mark.parametrize(
    ("label", "events"),
    [("every event empty", [b"", b""]), ("every stat empty", [_field(1, 0, 1) + _field(4, 2, b"")] * 2)],
)
def test_events_and_stats_at_their_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, label: str, events: list[bytes]
) -> None:
    """Events (or stats) that serialise to nothing are valid protobuf: read, as protobuf's messages give them."""
    path = _one_line_xspace(tmp_path, events, "d.xplane.pb")
    fast = read_trace(path)
    monkeypatch.setattr(xspace_events, "decode_events", lambda raw, with_stats: None)
    slow = read_trace(path)
    assert len(fast) == 2, label
    pd.testing.assert_frame_equal(fast, slow, check_exact=True)


def test_a_message_of_thousands_of_fields_is_left_to_protobuf(tmp_path: Path) -> None:
    """One numpy round per field of the longest message: past 1,024 fields the decoder gives up (protobuf's parse is
    then cheaper), and the file reads as protobuf reads it."""
    many = _field(1, 0, 1) + _field(4, 2, b"") * 2000
    buf = np.frombuffer(many + bytes(xs.WIRE_PAD), dtype=np.uint8)
    assert xs.decode_fields(buf, np.array([0]), np.array([len(many)])) is None
    few = _field(1, 0, 1) + _field(4, 2, b"") * 1000
    buf = np.frombuffer(few + bytes(xs.WIRE_PAD), dtype=np.uint8)
    fields = xs.decode_fields(buf, np.array([0]), np.array([len(few)]))
    assert fields is not None and len(fields.number) == 1001
    assert len(read_trace(_one_line_xspace(tmp_path, [many], "m.xplane.pb"))) == 1


@pytest.mark.parametrize(
    ("label", "event"),
    [
        ("a tag in 6 bytes", _field(1, 0, 1) + bytes.fromhex("faffffff8f00") + b"\x00"),
        ("a length in 6 bytes", _field(1, 0, 1) + b"\x22" + bytes.fromhex("8280808080") + b"\x00" + b"\x08\x01"),
    ],
)
def test_overlong_tags_and_lengths_give_protobufs_error(tmp_path: Path, label: str, event: bytes) -> None:
    """protobuf refuses a tag or a length written in more than 5 bytes; so does the reader, with protobuf's error."""
    buf = np.frombuffer(event + bytes(xs.WIRE_PAD), dtype=np.uint8)
    assert xs.decode_fields(buf, np.array([0]), np.array([len(event)])) is None, label
    with pytest.raises(TraceError, match=r"not an XSpace protobuf \(DecodeError"):
        read_trace(_one_line_xspace(tmp_path, [event], "o.xplane.pb"))


@pytest.mark.parametrize("seed", SEEDS[:6])
def test_batched_decoding_equals_one_batch(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The events are split into fields a bounded number of bytes at a time; any batch size (one event a batch,
    batches cutting lines, one batch for all) gives the same columns and values, and those of protobuf."""
    rng = random.Random(2000 + seed)
    lines = [[_random_event(rng) for _ in range(rng.randrange(0, 80))] for _ in range(5)]
    raw = [_raw_line(evs).events for evs in lines]
    with_stats = [True, False, True, True, rng.random() < 0.5]
    whole = xspace_events.decode_events(raw, with_stats, batch_bytes=1 << 40)
    assert whole is not None
    full = xs.xplane_classes()["XLine"]
    _assert_same_events(
        whole,
        xspace_events.message_events(
            [full.FromString(_raw_line(evs).SerializeToString()) for evs in lines], with_stats
        ),
    )
    for batch in (1, 7, 64, 500):
        got = xspace_events.decode_events(raw, with_stats, batch_bytes=batch)
        assert got is not None, batch
        _assert_same_events(got, whole)
    monkeypatch.setattr(xspace_events, "_JOIN_EVENTS", 3)  # the events taken out of protobuf's containers 3 at a time
    got = xspace_events.decode_events(raw, with_stats, batch_bytes=64)
    assert got is not None
    _assert_same_events(got, whole)


def test_damage_in_a_later_batch_still_gives_up() -> None:
    events = [_field(1, 0, 1) + _field(3, 0, 5)] * 50 + [b"\x08\xff"]  # the last one's varint is cut short
    assert xspace_events.decode_events([_raw_line(events).events], [True], batch_bytes=16) is None
    assert xspace_events.decode_events([_raw_line(events[:-1]).events], [True], batch_bytes=16) is not None


def _peak_bytes(fn: Any) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_decoding_memory_is_bounded_by_the_batch_not_the_fields() -> None:
    """A crafted line of events with 20 unknown 2-byte fields each: decoding holds the events' bytes, a few
    columns per event and one batch's fields (about 50 bytes a field), not every field of every event at once
    (numpy's arrays are traced by tracemalloc)."""
    events = [_field(1, 0, 1) + _field(2, 0, 1000 * i) + _field(3, 0, 500) + b"\x78\x01" * 20 for i in range(20_000)]
    raw = [_raw_line(events).events]
    nbytes, batch = sum(map(len, events)), 64 << 10
    bound = 3 * nbytes + 64 * len(events) + 64 * batch  # 9.3 MB here
    batched = _peak_bytes(lambda: xspace_events.decode_events(raw, [True], batch_bytes=batch))
    whole = _peak_bytes(lambda: xspace_events.decode_events(raw, [True], batch_bytes=1 << 40))
    assert batched < bound, (batched, bound)
    assert whole > 2 * bound, (whole, bound)  # all the fields at once: the bound above means something


def _plain_texts(blob: bytes, at: np.ndarray, size: np.ndarray) -> list[str]:
    return [blob[a : a + s].decode() for a, s in zip(at.tolist(), size.tolist(), strict=True)]


def test_texts_of_mixed_lengths_equal_their_slices() -> None:
    """Short strings are coded by their 8-byte words, long ones as objects; lengths 0-200, equal strings of
    different lengths (a prefix), bytes around each string that must not count, strings at the buffer's end."""
    rng = random.Random(7)
    words = ["", "a", "ab", "abcdefgh", "abcdefghi", "x" * 64, "x" * 65, "é→中" * 5, "y" * 200, "abcdefgh" * 8]
    parts, at, size = [], [], []
    pos = 0
    for _ in range(3000):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(3)))
        text = rng.choice(words).encode()
        parts += [junk, text]
        at.append(pos + len(junk))
        size.append(len(text))
        pos += len(junk) + len(text)
    blob = b"".join(parts) + bytes(xs.WIRE_PAD)
    at_, size_ = np.array(at, dtype=np.int64), np.array(size, dtype=np.int64)
    buf = np.frombuffer(blob, dtype=np.uint8)
    got = xspace_events.texts(blob, buf, at_, size_, True)
    assert got.tolist() == _plain_texts(blob, at_, size_)
    assert len({id(x) for x in got.tolist()}) == len(set(got.tolist()))  # one object per distinct string
    short = size_ <= 64
    assert xspace_events.texts(blob, buf, at_[short], size_[short], False).tolist() == [
        t.encode() for t in _plain_texts(blob, at_[short], size_[short])
    ]


def test_one_long_string_does_not_widen_the_short_ones() -> None:
    """100k short strings and one of 64 bytes: memory per string, not per string times the longest length."""
    n = 100_000
    blob = b"ab" * n + b"z" * 64 + bytes(xs.WIRE_PAD)
    at = np.append(np.arange(n, dtype=np.int64) * 2, 2 * n)
    size = np.append(np.full(n, 2, dtype=np.int64), 64)
    buf = np.frombuffer(blob, dtype=np.uint8)
    got: list[Any] = []
    peak = _peak_bytes(lambda: got.append(xspace_events.texts(blob, buf, at, size, True)))
    assert got[0][0] == "ab" and got[0][-1] == "z" * 64 and len(got[0]) == n + 1
    assert peak < 200 * (n + 1), peak  # 11 MB; was about 10 bytes per byte of the longest string, 64 MB here


def test_the_rounds_are_bounded_over_the_whole_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch holding an event of hundreds of fields would cost hundreds of numpy rounds a batch: over the
    file the decoder allows ``MAX_ROUNDS`` plus ``_ROUNDS_PER_BATCH`` a batch, then leaves the file to protobuf."""
    wide = _field(1, 0, 3) + b"\x48\x01" * 300  # 300 unknown varint fields
    events = [wide] * 40
    line = _raw_line(events)
    assert xspace_events.decode_events([line.events], [True]) is not None  # one batch: 301 rounds, within one call's
    monkeypatch.setattr(xspace_events, "_BATCH_BYTES", len(wide))  # one event a batch: 40 batches of 301 rounds
    calls: list[int] = []
    real = xs.decode_fields

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(xs, "decode_fields", counted)
    assert xspace_events.decode_events([line.events], [True], batch_bytes=len(wide)) is None
    assert len(calls) < 40  # gave up before the last batch
    narrow = [_field(1, 0, 3) + b"\x48\x01" * 20] * 40  # 21 rounds a batch: within the budget
    assert xspace_events.decode_events([_raw_line(narrow).events], [True], batch_bytes=len(narrow[0])) is not None
