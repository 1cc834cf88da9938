"""Where a book build keeps the results that one page writes and another reads (the committed
runs and the repository they live in: ``perfladder.results.committed``)."""
from __future__ import annotations

import os
from pathlib import Path

from perfladder.results.committed import repo_root


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

