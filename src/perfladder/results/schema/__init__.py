"""Reading and checking results JSON (framework-free).

* ``read_json(path)``: the file's JSON and a digest of its text, or a one-line ``ResultsError``
  naming the file (missing, unreadable, not JSON, nested absurdly deep, or holding NaN / infinity);
* ``validate(data, source, digest=None)``: the JSON Schema in ``results-v2.schema.json``
  (checked with ``jsonschema``), then what a schema cannot say (unique rung names, skipped rungs
  carry no rate, a measured rung carries its windows, the baseline). Given the ``digest`` of the
  text ``data`` was parsed from, a text this process has already found valid is not checked
  again (the pages read the same committed files many times; the check is most of a read);
* ``upgrade(data, source)``: a version-1 file as version 2 (``perfladder.results.schema.v1``);
* ``version_advice(data, version)``: for a file of a schema this perfladder does not read,
  which perfladder wrote it (``versions.perfladder``) and what to do (upgrade, or read it with
  that version).
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from perfladder.results.schema.v1 import to_v2
from perfladder.results.version import SCHEMA_VERSION, ResultsError

MAX_DEPTH = 64          # results nest a handful of levels; anything deeper is not ours
_VALID: set[bytes] = set()   # digests of the texts validate() passed in this process


@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(resources.files(__package__).joinpath("results-v2.schema.json").read_text())


def digest(raw: bytes) -> bytes:
    """A file's bytes as a key: equal keys, equal contents."""
    return hashlib.blake2b(raw, digest_size=16).digest()


def read_json(path: Path) -> tuple[Any, bytes]:
    """The file's JSON and a digest of its text (for ``validate``)."""
    try:
        raw = path.read_bytes()
        text = raw.decode()
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such results file") from None
    except IsADirectoryError:
        raise ResultsError(f"{path}: is a directory, not a results file") from None
    except OSError as e:
        raise ResultsError(f"{path}: cannot read results file ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ResultsError(f"{path}: not a text file ({e.reason})") from None
    try:
        return json.loads(text), digest(raw)
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise ResultsError(f"{path}: JSON nested too deeply to be a results file") from None
    except ValueError as e:      # an integer of more digits than Python converts
        limit = getattr(sys, "get_int_max_str_digits", lambda: 4300)()
        why = (f"it holds an integer longer than {limit} digits" if "integer string conversion" in str(e)
               else str(e))
        raise ResultsError(f"{path}: not a results file ({why})") from None


def _walk(x, where: str, depth: int = 0):
    """Refuse non-finite numbers (naming the field) and absurd nesting."""
    if depth > MAX_DEPTH:
        raise ResultsError(f"nested deeper than {MAX_DEPTH} levels at {where}")
    if isinstance(x, float) and not math.isfinite(x):
        raise ResultsError(f"{where} is {x!r}: results hold finite numbers only")
    if isinstance(x, dict):
        for k, v in x.items():
            _walk(v, f"{where}.{k}", depth + 1)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            _walk(v, f"{where}[{i}]", depth + 1)


def _field(path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "(top level)"


def validate(data: Any, source: str = "<results>", digest: bytes | None = None) -> None:
    """Raise ``ResultsError`` naming ``source`` and the first thing wrong with ``data``;
    ``digest``: ``read_json``'s, of the text ``data`` came from (a text found valid once is not
    checked again)."""
    if digest is not None and digest in _VALID:
        return
    _check(data, source)
    if digest is not None:
        _VALID.add(digest)


def _check(data: Any, source: str) -> None:
    import jsonschema

    def bad(msg):
        raise ResultsError(f"{source}: {msg}")

    if not isinstance(data, dict):
        bad(f"top level must be a JSON object, got {type(data).__name__}")
    try:
        _walk(data, "results")
    except ResultsError as e:
        bad(str(e))
    version = data.get("schema_version")
    if not _is_int(version):
        bad(f"schema_version {json.dumps(version)} is not a number; expected {SCHEMA_VERSION} (or 1)")
    if version != SCHEMA_VERSION:
        bad(f"schema_version {version!r} is not supported (expected {SCHEMA_VERSION}): "
            + version_advice(data, version))
    errors = sorted(jsonschema.Draft202012Validator(schema()).iter_errors(data),
                    key=lambda e: list(e.absolute_path))
    if errors:
        e = _innermost(errors[0])
        where = _field(e.absolute_path)
        rung = _rung_name(data, e.absolute_path)
        bad(f"{where}{f' (rung {rung})' if rung else ''}: {e.message}")
    names = []
    for i, r in enumerate(data["rungs"]):
        where = f"rungs[{i}] ({r['name']})"
        if r["kind"] == "skipped" and r["tokens_per_s"] is not None:
            bad(f"{where} is 'skipped' but has tokens_per_s")
        if r["kind"] != "skipped" and r["tokens_per_s"] is None:
            bad(f"{where} is {r['kind']!r} but has no tokens_per_s")
        if r["tokens_per_s"] is not None and not r.get("timing"):
            bad(f"{where} has tokens_per_s but no timing windows")
        if r["tokens_per_s"] is not None:
            _check_rate(r, where, bad)
        names.append(r["name"])
    if len(set(names)) != len(names):
        bad(f"rung names repeat: {names}")


def writer_version(data: dict) -> str | None:
    """The perfladder version that wrote ``data``, where its ``versions`` record it."""
    versions = data.get("versions")
    v = versions.get("perfladder") if isinstance(versions, dict) else None
    return v if isinstance(v, str) and v.strip() else None


def version_advice(data: dict, version: int) -> str:
    """Who wrote a file of another schema version, and what to do about it, for a person."""
    from perfladder import __version__
    writer = writer_version(data)
    if version > SCHEMA_VERSION:
        by = (f"perfladder {writer}, newer than this one ({__version__})" if writer
              else f"a perfladder newer than this one ({__version__})")
        to = f" (to {writer} or later)" if writer else ""
        return f"it was written by {by}; upgrade perfladder{to} to read it"
    by = (f"perfladder {writer}, older than this one ({__version__}) reads" if writer
          else f"a perfladder older than this one ({__version__}) reads")
    with_it = f"perfladder {writer}" if writer else "the perfladder that wrote it"
    return f"it was written by {by}; read it with {with_it}, or run the ladder again to write it anew"


def _is_int(v) -> bool:
    """A JSON integer: ``true`` is an ``int`` to Python, but not a version number."""
    return isinstance(v, int) and not isinstance(v, bool)


def _check_rate(r: dict, where: str, bad) -> None:
    """A measured rate is the median of its settled windows, so it lies within them (a
    rate outside would draw a negative error bar)."""
    t = r["timing"]
    settled = t["windows"][-t["settled"]:] if t.get("settled") else t["windows"]
    if not settled:
        return
    lo, hi, rate = min(settled), max(settled), r["tokens_per_s"]
    slack = 1e-9 * max(abs(hi), 1.0)
    if not lo - slack <= rate <= hi + slack:
        bad(f"{where}: tokens_per_s {rate:,.6g} lies outside its own settled windows "
            f"({lo:,.6g} to {hi:,.6g})")


def _innermost(e):
    """A ``oneOf``'s own message says only 'not valid under any of the given schemas': report
    the branch that got furthest instead (the 'null' of a 'null or ...' is never the story)."""
    while e.context:
        ctx = list(e.context)
        real = [c for c in ctx if c.validator != "type"] or ctx[-1:]
        e = max(real, key=lambda c: len(c.absolute_path))
    return e


def _rung_name(data, path) -> str | None:
    path = list(path)
    if len(path) >= 2 and path[0] == "rungs" and isinstance(path[1], int):
        try:
            return data["rungs"][path[1]]["name"]
        except (IndexError, KeyError, TypeError):
            return None
    return None


def upgrade(data: Any, source: str = "<results>") -> Any:
    """Version-1 files become version 2; anything else is returned unchanged."""
    if isinstance(data, dict) and _is_int(data.get("schema_version")) and data["schema_version"] == 1:
        try:
            _walk(data, "results")
        except ResultsError as e:
            raise ResultsError(f"{source}: {e}") from None
        return to_v2(data, source)
    return data

