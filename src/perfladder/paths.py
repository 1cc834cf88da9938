"""Where a build's results go and where the committed runs are: moved to ``perfladder.book.paths``
and ``perfladder.results.committed``; these names stay importable from here."""
from perfladder.book.paths import build_results_dir  # noqa: F401
from perfladder.results.committed import REFERENCE_FILE, reference_run, repo_root  # noqa: F401
