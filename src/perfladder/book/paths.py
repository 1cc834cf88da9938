"""Where a book build keeps the results that one page writes and another reads."""
from __future__ import annotations

import os
from pathlib import Path


def repo_root(start: str | Path | None = None) -> Path | None:
    """The nearest folder at or above ``start`` (default: cwd) holding ``_config.yml``."""
    here = Path(start or Path.cwd()).resolve()
    for p in (here, *here.parents):
        if (p / "_config.yml").is_file() and (p / "_toc.yml").is_file():
            return p
    return None


def build_results_dir() -> Path:
    """``$PERFLADDER_RESULTS_DIR``, else ``<book root>/_build/results``, else ``./perfladder_results``.

    The ladder notebooks write ``torch.json`` / ``jax.json`` (and PNGs) here during a book
    build; the comparison page reads them back. Inside ``_build`` they go when the build goes.
    """
    env = os.environ.get("PERFLADDER_RESULTS_DIR")
    if env:
        source = f"$PERFLADDER_RESULTS_DIR={env!r}"
        try:
            path = Path(env).expanduser()
        except RuntimeError:      # '~user' of a user this machine does not have
            raise ValueError(f"{source}: no user {env[1:].split(os.sep, 1)[0]!r} on this machine") from None
    else:
        root = repo_root()
        path = root / "_build" / "results" if root else Path("perfladder_results")
        source = f"the results folder {str(path)!r}"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        raise ValueError(f"{source} cannot be a folder: {blocker} is a file") from None
    except OSError as e:
        raise ValueError(f"{source} cannot be created ({e.strerror or e})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{source} is not writable")
    return path


REFERENCE_FILE = Path("benchmarks") / "results" / "reference.txt"
REFERENCE_FRAMEWORKS = ("torch", "jax")


def reference_run(root: str | Path | None = None, framework: str | None = None) -> Path:
    """The committed run a page shows when this build cannot measure one itself: a folder
    under ``benchmarks/results/`` named in ``benchmarks/results/reference.txt``.

    Each line that is neither blank nor a ``#`` comment is ``FOLDER`` (the run of every
    framework) or ``FRAMEWORK FOLDER`` (that framework's run, which wins for it), so one
    framework's reference can move to a newer run without the other's. ``root``: the
    repository (default: the book root above the working directory, else above this package).
    """
    base = Path(root) if root is not None else (repo_root() or repo_root(Path(__file__).parent))
    if base is None:
        raise FileNotFoundError(f"no book root (_config.yml + _toc.yml) above {Path.cwd()} or "
                                f"{Path(__file__).parent}: cannot find {REFERENCE_FILE}")
    pointer = base / REFERENCE_FILE
    if not pointer.is_file():
        raise FileNotFoundError(f"{pointer} is missing: it names the committed reference run "
                                "(a folder under benchmarks/results/)")
    if framework is not None and framework not in REFERENCE_FRAMEWORKS:
        raise ValueError(f"framework={framework!r} is not valid; valid choices: {REFERENCE_FRAMEWORKS}")
    default, named = None, {}
    for ln in pointer.read_text().splitlines():
        words = ln.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) == 1:
            default = default or words[0]
        elif len(words) == 2 and words[0] in REFERENCE_FRAMEWORKS:
            named.setdefault(words[0], words[1])
        else:
            raise ValueError(f"{pointer}: line {ln.strip()!r} is not 'FOLDER' or 'FRAMEWORK FOLDER' "
                             f"(FRAMEWORK one of {', '.join(REFERENCE_FRAMEWORKS)})")
    name = named.get(framework) or default
    if name is None:
        raise ValueError(f"{pointer} names no run folder" + (f" for {framework}" if framework else ""))
    folder = pointer.parent / name
    if not folder.is_dir() or "/" in name or name in (".", ".."):
        choices = sorted(p.name for p in pointer.parent.iterdir() if p.is_dir())
        raise ValueError(f"{pointer} names {name!r}, which is not a run folder; "
                         f"valid choices: {', '.join(choices)}")
    return folder
