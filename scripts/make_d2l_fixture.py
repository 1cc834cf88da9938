"""Record what d2l 1.0.3's own ``TimeMachine`` produces, as a small JSON fixture.

``tests/test_data.py`` compares ``perfladder.data.TimeMachine`` against this file, so the
claim "perfladder's data is d2l's data, value for value" is checked against d2l itself, not
against a re-implementation of it. d2l is NOT a dependency of perfladder (it pins
numpy==1.23.5); run this script once, in a throwaway virtual environment::

    python3 -m venv /tmp/d2lvenv
    /tmp/d2lvenv/bin/pip install d2l==1.0.3 --no-deps
    /tmp/d2lvenv/bin/pip install numpy==1.23.5 scipy==1.10.1 pandas==2.0.3 \\
        matplotlib==3.7.2 matplotlib-inline==0.1.6 requests==2.31.0 ipython pillow torch
    /tmp/d2lvenv/bin/python scripts/make_d2l_fixture.py   # from the repository root

(These are the packages ``import d2l.torch`` needs, at d2l's pins where it pins them;
``jupyter`` is skipped.) ``d2l.torch`` also imports ``torchvision`` at the top of the
module, for its image datasets only. Where no torchvision build matches the installed
torch (a CPU-only torch with only CUDA torchvision wheels around), the script puts an
empty stand-in module in ``sys.modules`` before importing d2l and records that in the
fixture; nothing of torchvision is used on the text path.

Nothing is downloaded: the shipped text is copied to where ``d2l.download`` looks
(``../data/timemachine.txt`` relative to the working directory, the ``DataModule``
default root), d2l's sha1 check accepts it, and ``requests.get`` is replaced by a
function that raises, so a download attempt would fail loudly instead of fetching.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEXT = REPO / "src" / "perfladder" / "assets" / "timemachine.txt"
OUT = REPO / "tests" / "fixtures" / "d2l_timemachine.json"
NUM_STEPS = (128, 16)
ROWS = (9999, 10000, 14999)    # last train window, first val window, last val window (defaults)


def _torchvision_or_stub() -> str:
    try:
        import torchvision  # noqa: F401
        return torchvision.__version__
    except Exception as e:  # ImportError, or a CUDA build failing to load its ops
        for name in list(sys.modules):
            if name == "torchvision" or name.startswith("torchvision."):
                del sys.modules[name]
        tv = types.ModuleType("torchvision")
        tv.transforms = types.ModuleType("torchvision.transforms")
        sys.modules["torchvision"] = tv
        sys.modules["torchvision.transforms"] = tv.transforms
        return f"stub ({type(e).__name__}: {str(e).splitlines()[0][:120]})"


def _sha256_int64(t) -> str:
    import numpy as np
    a = np.ascontiguousarray(t.numpy().astype(np.int64))
    return hashlib.sha256(a.tobytes()).hexdigest()


def main() -> None:
    torchvision_used = _torchvision_or_stub()
    import numpy as np
    import requests
    import torch

    def no_download(*args, **kwargs):
        raise RuntimeError(f"d2l tried to download {args[:1]}: the pre-placed file was not accepted")
    requests.get = no_download

    import d2l
    from d2l import torch as d2l_torch

    with tempfile.TemporaryDirectory() as tmp:
        work, data_dir = Path(tmp) / "work", Path(tmp) / "data"
        work.mkdir()
        data_dir.mkdir()
        shutil.copyfile(TEXT, data_dir / "timemachine.txt")
        old = os.getcwd()
        os.chdir(work)          # d2l's default root is '../data'
        try:
            per_steps = {}
            corpus_len = None
            for T in NUM_STEPS:
                tm = d2l_torch.TimeMachine(batch_size=2, num_steps=T)
                corpus, vocab = tm.build(tm._download())
                corpus_len = len(corpus)
                X, Y = tm.X, tm.Y
                per_steps[str(T)] = {
                    "dtype": str(X.dtype),
                    "X_shape": list(X.shape),
                    "Y_shape": list(Y.shape),
                    "X_first3": X[:3].tolist(),
                    "Y_first3": Y[:3].tolist(),
                    "X_rows": {str(i): X[i].tolist() for i in ROWS},
                    "Y_rows": {str(i): Y[i].tolist() for i in ROWS},
                    "X_sha256_int64": _sha256_int64(X),
                    "Y_sha256_int64": _sha256_int64(Y),
                }
                idx_to_token, vocab_len = list(vocab.idx_to_token), len(vocab)
                num_train, num_val = tm.num_train, tm.num_val
        finally:
            os.chdir(old)

    fixture = {
        "about": "values of d2l.torch.TimeMachine for perfladder's shipped timemachine.txt; "
                 "written by scripts/make_d2l_fixture.py",
        "versions": {"d2l": getattr(d2l, "__version__", "?"), "torch": torch.__version__,
                     "numpy": np.__version__, "torchvision": torchvision_used,
                     "python": sys.version.split()[0]},
        "text_sha1": hashlib.sha1(TEXT.read_bytes()).hexdigest(),
        "idx_to_token": idx_to_token,
        "vocab_len": vocab_len,
        "corpus_len": corpus_len,
        "num_train": num_train,
        "num_val": num_val,
        "rows": list(ROWS),
        "num_steps": per_steps,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(fixture, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes): vocab {vocab_len}, corpus {corpus_len}, "
          + ", ".join(f"T={T}: X {v['X_shape']}" for T, v in per_steps.items()))


if __name__ == "__main__":
    main()
