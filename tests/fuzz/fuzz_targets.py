"""The fuzz targets: one ``one_input(data)`` per parser that reads untrusted bytes.

Each target feeds the bytes to the real parser and lets through only the
refusal the parser documents (its ``*Error`` naming the problem); any other
exception is a crash, and atheris (tests/fuzz/run_fuzz.py) records the input.
Where the parser's output can be checked against itself, the target also
asserts that (a decoded frame re-encodes to the same message; a store URL the
config check accepts is one ``sqlite_path`` reads). The same functions replay
the kept crashers in tests/fuzz/test_fuzz.py, without atheris.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from artemis.protocol.codec import FrameDecoder, decode_frame_body, encode
from artemis.protocol.messages import REASONS, Message, ProtocolError
from artemis.protocol.session import SESSION_CODES, CoordinatorSession, SeqTracker

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------- frame decoder


def frame(data: bytes) -> None:
    """Bytes from a peer: the incremental decoder, then the coordinator's session.

    The decoder never raises; each item is a message or a ProtocolError with a
    known reason; a decoded message re-encodes to a stable frame; the
    coordinator session turns every item into effects without raising.
    """
    if not data:
        return
    # The first byte picks how the stream is cut into reads (a peer decides that too).
    step = 1 + data[0] % 64
    stream = data[1:]
    dec = FrameDecoder(4096)
    session = CoordinatorSession(b"fuzz-secret", SeqTracker())
    items: list[Message | ProtocolError] = []
    for i in range(0, len(stream), step):
        items.extend(dec.feed(stream[i : i + step]))
    end = dec.eof()
    if end is not None:
        items.append(end)
    for it in items:
        if isinstance(it, ProtocolError):
            assert it.reason in REASONS or it.reason in SESSION_CODES, it.reason
            assert it.text, "a ProtocolError must say what was wrong"
        else:
            # A decoded message re-encodes, decodes as the same type, and from then
            # on the frame is stable (compared as bytes: absent numbers are NaN,
            # NaN != NaN; a 1.0 windows frame comes back in the 1.1 form).
            again = decode_frame_body(encode(it, max_frame=1 << 24)[4:])
            assert type(again) is type(it), (it, again)
            f2 = encode(again, max_frame=1 << 24)
            assert encode(decode_frame_body(f2[4:]), max_frame=1 << 24) == f2, (it, again)
        session.receive(it)


# ---------------------------------------------------------------- ring reader

_RING_TEMPLATE: bytes | None = None
_RING_DIR = Path(tempfile.mkdtemp(prefix="artemis-fuzz-ring-"))
# made at import (each pytest worker, each fuzzer) and gone with the process
atexit.register(shutil.rmtree, _RING_DIR, True)


def _ring_template() -> bytes:
    """A valid small ring (8 slots, 5 records) written by the real bridge writer."""
    global _RING_TEMPLATE
    if _RING_TEMPLATE is None:
        from artemis.ring.writer import BridgeRingWriter

        d = _RING_DIR / "template"
        d.mkdir(exist_ok=True)
        w = BridgeRingWriter(d, "fuzzjob", 0x0123456789ABCDEF, 1, 4, 8)
        for t in range(5):
            w.append(peer=0, nbytes=64 + t, start=10 * t, end=10 * t + 5, coll_seq=t)
        w.close()
        _RING_TEMPLATE = w.path.read_bytes()
        w.path.unlink()
    return _RING_TEMPLATE


def ring_file(data: bytes) -> bytes:
    """The ring file a fuzz input stands for (also used to seed the corpus).

    First byte even: the rest patched over a valid ring (pairs of a 2-byte
    offset and a byte), so the fuzzer spends its time past the header checks;
    odd: the rest is the whole file.
    """
    if not data:
        return b""
    if data[0] & 1:
        return data[1:]
    buf = bytearray(_ring_template())
    rest = data[1:]
    for i in range(0, len(rest) - 2, 3):
        off = int.from_bytes(rest[i : i + 2], "little") % len(buf)
        buf[off] = rest[i + 2]
    # The top bits of the first byte cut the file short (a truncated ring).
    cut = data[0] >> 1
    if cut >= 120:
        del buf[len(buf) - (cut - 119) * 8 :]
    return bytes(buf)


def ring(data: bytes) -> None:
    """A corrupted ring file: RingReader refuses it with RingError or reads it whole."""
    from artemis.ring.reader import RingError, RingReader, cpu_times_ns, records_to_dicts

    path = _RING_DIR / f"r-{os.getpid()}.ring"
    path.write_bytes(ring_file(data))
    try:
        reader = RingReader(path)
    except RingError as e:
        assert str(e).startswith(str(path)), e
        return
    with reader:
        hdr = reader.header()
        for _ in range(2):
            batch = reader.poll()
            assert batch.lost >= 0
            records_to_dicts(batch.done, hdr)
            records_to_dicts(batch.in_flight, hdr)
            cpu_times_ns(batch.done)
        records_to_dicts(reader.last(16), hdr)


# ---------------------------------------------------------------- scenario parser


def scenario(data: bytes) -> None:
    from artemis.sim.scenario import ScenarioError, parse_scenario

    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return  # load_scenario turns these into ScenarioError("not valid TOML")
    try:
        parse_scenario(doc, "fuzz.toml")
    except ScenarioError as e:
        assert str(e).startswith("fuzz.toml"), e


# ---------------------------------------------------------------- config parsers


def config(data: bytes) -> None:
    """Both daemons' TOML configs (tomlfile.from_mapping + validated) and [detector]."""
    from artemis.agent.config import AgentConfig
    from artemis.common.tomlfile import ConfigError, from_mapping
    from artemis.coordinator.config import CoordinatorConfig
    from artemis.detect.settings import Settings, SettingsError

    if not data:
        return
    cls: type[AgentConfig] | type[CoordinatorConfig] = (
        AgentConfig if data[0] & 1 else CoordinatorConfig
    )
    try:
        doc = tomllib.loads(data[1:].decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return  # read_toml turns these into ConfigError("not valid TOML")
    try:
        cfg = from_mapping(cls, doc, "fuzz.toml").validated()
    except ConfigError as e:
        assert str(e), "a ConfigError must say what was wrong"
        return
    if isinstance(cfg, CoordinatorConfig):
        try:
            Settings.from_mapping(cfg.detector)
        except SettingsError as e:
            assert str(e)


# ---------------------------------------------------------------- store URL


def store_url(data: bytes) -> None:
    """The `store` setting and URL: check_setting never raises; what it accepts opens."""
    from artemis.store.base import StoreError, open_store, sqlite_path
    from artemis.store.base import store_url as make_url
    from artemis.store.sink import check_setting

    s = data.decode("utf-8", "replace")
    bad = check_setting(s)
    assert bad is None or isinstance(bad, str)
    scheme = s.split(":", 1)[0].lower() if ":" in s else ""
    if scheme == "sqlite":
        try:
            p = sqlite_path(s.strip())
        except StoreError as e:
            assert bad is not None, f"check_setting accepted {s!r} but sqlite_path refused: {e}"
            return
        if bad is None:
            assert str(p), s
            # The URL of that path names the same path.
            assert sqlite_path(make_url(p)) == p, (s, p)
        return
    if scheme in ("postgresql", "postgres"):
        # Checked as open_store checks it before it connects (no connection from
        # a fuzzer): a clear StoreError or the parameters.
        from artemis.store.postgres import check_url

        try:
            check_url(s)
        except StoreError as e:
            assert str(e)
        return
    try:
        open_store(s)  # any other scheme is refused before anything is opened
    except StoreError as e:
        assert str(e)
    else:  # pragma: no cover - only sqlite opens, and it was handled above
        raise AssertionError(f"open_store accepted {s!r}")


# What each target exercises: imported under atheris' instrumentation by run_fuzz.py
# (coverage is only collected for modules imported inside that block).
MODULES: dict[str, tuple[str, ...]] = {
    "frame": (
        "artemis.protocol.codec",
        "artemis.protocol.messages",
        "artemis.protocol.columns",
        "artemis.protocol.records",
        "artemis.protocol.session",
    ),
    "ring": ("artemis.ring.reader", "artemis.ring.format"),
    "scenario": ("artemis.sim.scenario",),
    "config": (
        "artemis.common.tomlfile",
        "artemis.agent.config",
        "artemis.coordinator.config",
        "artemis.detect.settings",
        "artemis.protocol.transport",
    ),
    "store_url": ("artemis.store.base", "artemis.store.sink"),
}

TARGETS: dict[str, Callable[[bytes], None]] = {
    "frame": frame,
    "ring": ring,
    "scenario": scenario,
    "config": config,
    "store_url": store_url,
}


KEPT = REPO / "tests" / "fuzz" / "corpus"


def kept(target: str) -> list[Path]:
    """The regression inputs of a target: crashers found (and fixed) so far."""
    d = KEPT / target
    return sorted(p for p in d.iterdir() if p.is_file()) if d.is_dir() else []


def prepare_corpus(target: str, corpus: Path) -> None:
    """Fill a working corpus with the seeds and the kept inputs."""
    import hashlib

    corpus.mkdir(parents=True, exist_ok=True)
    for data in [*seeds(target), *(p.read_bytes() for p in kept(target))]:
        (corpus / hashlib.sha1(data).hexdigest()).write_bytes(data)


def seeds(target: str) -> list[bytes]:
    """Valid inputs the fuzzer starts from (generated, so they follow the code)."""
    if target == "frame":
        sys.path.insert(0, str(REPO / "tests" / "protocol"))
        from protocol_helpers import every_message

        out = []
        for m in every_message():
            try:
                out.append(b"\x00" + encode(m, max_frame=1 << 24))
            except ProtocolError:
                continue
        return out
    if target == "ring":
        return [b"\x00", b"\x01" + _ring_template()]
    if target == "scenario":
        return [p.read_bytes() for p in sorted((REPO / "sim" / "scenarios").glob("*.toml"))]
    if target == "config":
        return [
            b"\x01" + (REPO / "deploy" / "agent.toml").read_bytes(),
            b"\x00" + (REPO / "deploy" / "coordinator.toml").read_bytes(),
        ]
    if target == "store_url":
        return [b"auto", b"off", b"sqlite:///x.db", b"sqlite:////tmp/a.db", b"postgresql://h/db"]
    raise KeyError(target)
