"""The key of the book's notebook cache: what a cached page's numbers depend on (no framework imports).

The book executes its notebooks through jupyter-cache, which re-runs a notebook only when the
notebook's own code changed. The numbers on a page also depend on the library the notebook
imports, the framework versions, the ladder configuration, the machine, and the committed
runs under ``benchmarks/results/`` (``reference.txt`` names the ones a ladder page shows on a
machine without a GPU); a cached page built with any of those different would show stale
numbers. ``cache_key`` hashes all of them, and ``scripts/build_book.sh`` empties the cache
whenever the key differs from the one the cache was built with:

    python -m perfladder.book.cache --config smoke --device cpu      # prints the key
"""
from __future__ import annotations

import argparse
import hashlib
import platform
from importlib import metadata
from pathlib import Path

FRAMEWORKS = ("torch", "jax", "jaxlib", "flax", "optax", "numpy")
SOURCE_PATTERNS = ("**/*.py", "assets/*")


def package_dir() -> Path:
    """The folder of the ``perfladder`` package being imported (what the notebooks run)."""
    return Path(__file__).resolve().parents[1]


def source_files(src: str | Path | None = None) -> list[Path]:
    """The library's files that a page's numbers depend on: every ``.py`` and every asset,
    sorted (bytecode caches excluded)."""
    root = Path(src) if src is not None else package_dir()
    if not root.is_dir():
        raise FileNotFoundError(f"source folder {root} does not exist")
    files = {p for pat in SOURCE_PATTERNS for p in root.glob(pat)
             if p.is_file() and "__pycache__" not in p.parts}
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def source_hash(src: str | Path | None = None) -> str:
    """sha256 over the relative path and the bytes of every ``source_files`` entry."""
    root = Path(src) if src is not None else package_dir()
    h = hashlib.sha256()
    for p in source_files(root):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


def results_dir() -> Path | None:
    """``benchmarks/results`` of the book root above the working directory, else above this
    package (None: neither is in a book tree), as ``perfladder.results.committed.reference_run`` finds it."""
    from perfladder.book.paths import repo_root
    root = repo_root() or repo_root(Path(__file__).parent)
    return None if root is None else root / "benchmarks" / "results"


def results_hash(folder: str | Path | None) -> str:
    """sha256 over the relative path and bytes of every file under ``folder`` (the committed
    runs and ``reference.txt``); ``'absent'`` when there is no such folder."""
    if folder is None or not Path(folder).is_dir():
        return "absent"
    root = Path(folder)
    h = hashlib.sha256()
    for p in sorted((p for p in root.rglob("*") if p.is_file()),
                    key=lambda p: p.relative_to(root).as_posix()):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


def framework_versions(names=FRAMEWORKS) -> dict[str, str]:
    """Installed version of each distribution (``'absent'`` when not installed), read from the
    package metadata without importing the frameworks."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


_DEFAULT = object()


def key_parts(config: str, device: str, src: str | Path | None = None,
              versions: dict[str, str] | None = None, results=_DEFAULT) -> dict[str, str]:
    """What the key is made of, by name (printed by the build script's ``--key``)."""
    if not config:
        raise ValueError("config must name the ladder configuration (e.g. 'smoke' or 'full')")
    if not device:
        raise ValueError("device must describe the machine (e.g. 'cpu' or the GPU's name)")
    vers = framework_versions() if versions is None else dict(versions)
    folder = results_dir() if results is _DEFAULT else results
    from perfladder.ladder.fit import memory_cap_gib  # which rungs fit depends on it
    cap = memory_cap_gib()
    return {"config": config, "device": device, "python": platform.python_version(),
            "source": source_hash(src), "results": results_hash(folder),
            **({} if cap is None else {"memory_cap_gib": f"{cap:g}"}),
            **{f"version:{k}": v for k, v in sorted(vers.items())}}


def cache_key(config: str, device: str, src: str | Path | None = None,
              versions: dict[str, str] | None = None, results=_DEFAULT) -> str:
    """A short hex key that changes when the library's source (``src``: default, the imported
    package), a framework version, the configuration, the device or the committed runs
    (``results``: default, ``benchmarks/results`` of the book root) change."""
    parts = key_parts(config, device, src, versions, results)
    text = "\n".join(f"{k}={v}" for k, v in parts.items())
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perfladder.book.cache",
                                 description="Print the notebook cache key of a book build.")
    ap.add_argument("--config", required=True, help="ladder configuration (smoke or full)")
    ap.add_argument("--device", required=True, help="the machine (e.g. 'cpu' or the GPU's name)")
    ap.add_argument("--src", default=None, help="library source folder (default: the imported package)")
    ap.add_argument("--results", default=None,
                    help="the committed runs (default: benchmarks/results of the book root)")
    ap.add_argument("--parts", action="store_true", help="also print what the key is made of")
    args = ap.parse_args(argv)
    results = _DEFAULT if args.results is None else args.results
    print(cache_key(args.config, args.device, args.src, results=results))
    if args.parts:
        for k, v in key_parts(args.config, args.device, args.src, results=results).items():
            print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    from perfladder.faults import guarded
    raise SystemExit(guarded("perfladder.book.cache", main))
