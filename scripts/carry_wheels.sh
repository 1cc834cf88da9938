#!/usr/bin/env bash
# Fill .whl/ with the wheels a GPU machine WITHOUT a package registry needs to build the book.
#
#   scripts/carry_wheels.sh            # here, where pip reaches a registry
#   # copy .whl/ to the GPU machine with the working tree, then there:
#   PYTHON=python3 make book           # setup.sh installs from .whl/ with --no-index
#
# The target is this project's H200 image: CPython 3.12 on x86-64 Linux, which already has
# torch, jax, flax, optax, numpy, matplotlib, pytest, jinja2, pyyaml and more (the list in
# BOX_HAS below, from the image's package list). What it lacks is Jupyter Book and its
# tree (Sphinx, myst-nb, the theme, the bundled MathJax of sphinx-mathjax-offline, ...) and
# the Jupyter kernel (ipykernel, pyzmq, tornado, jupyter-client, ...); those are downloaded
# here as cp312 manylinux / pure-python wheels, at the versions this machine's .venv has (so
# the GPU build uses what the CPU build tested), one version of each.
#
# Environment: PYTHON (a python with pip; default python3), PERFLADDER_WHEELS (default .whl),
# PERFLADDER_VENV (the venv whose versions to pin to; default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=${PERFLADDER_WHEELS:-.whl}
VENV=${PERFLADDER_VENV:-.venv}
log() { echo "[carry_wheels] $*" >&2; }

# What the book needs on top of the image (setup.sh installs perfladder with these extras).
REQS=("jupyter-book==1.0.4.post1" "sphinx-design" "sphinx-mathjax-offline==0.0.2" "ipykernel>=6"
      "nbclient>=0.10" "nbformat>=5.9" "jsonschema>=4" "pytest-xdist>=3.5"
      # the editable install of perfladder builds in an isolated env: its build backend
      "setuptools>=68" "wheel")

# Already in the image (its `pip list`): not carried...
BOX_HAS="attrs certifi charset-normalizer click filelock idna jinja2 markupsafe numpy matplotlib
packaging pillow psutil pygments python-dateutil pyyaml requests six tabulate typing-extensions
urllib3 zipp pytest pytest-timeout pluggy iniconfig"
# ...except these, carried anyway as a fallback: myst-parser 3 pins markdown-it-py ~= 3.0
# and the image may hold a newer one (pip keeps the image's copy when it satisfies the pin);
# setuptools, wheel and packaging are what the isolated build of perfladder itself installs.
KEEP="markdown-it-py mdurl setuptools wheel packaging"

norm() { echo "$1" | tr '[:upper:]_.' '[:lower:]--'; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

constraints=()
if [ -x "$VENV/bin/python" ]; then
  "$VENV/bin/python" -m pip freeze --disable-pip-version-check 2>/dev/null \
    | grep -E '^[A-Za-z0-9_.-]+==' \
    | grep -viE '^(torch|jax|jaxlib|flax|optax|numpy|scipy|matplotlib|perfladder)==' > "$tmp/constraints.txt" || true
  constraints=(-c "$tmp/constraints.txt")
  log "pinning to the versions in $VENV ($(wc -l < "$tmp/constraints.txt") constraints)"
fi

log "downloading cp312 manylinux x86_64 / pure-python wheels for: ${REQS[*]}"
"$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 \
  --platform manylinux2010_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  "${constraints[@]}" -d "$tmp/all" "${REQS[@]}"

mkdir -p "$tmp/keep"
dropped=()
for whl in "$tmp"/all/*.whl; do
  name=$(norm "$(basename "$whl" | cut -d- -f1)")
  if [[ " $(norm "$BOX_HAS" | tr '\n' ' ') " == *" $name "* && " $KEEP " != *" $name "* ]]; then
    dropped+=("$name")
    continue
  fi
  cp "$whl" "$tmp/keep/"
done

# one version of each: two wheels of one project stop the whole offline install
dups=$(for w in "$tmp"/keep/*.whl; do norm "$(basename "$w" | cut -d- -f1)"; done | sort | uniq -d)
if [ -n "$dups" ]; then
  log "ERROR: several versions of: $dups"
  exit 1
fi

rm -rf "$DEST"
mkdir -p "$DEST"
cp "$tmp"/keep/*.whl "$DEST/"
log "left out (the image has them): ${dropped[*]:-none}"
log "$(ls "$DEST"/*.whl | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST/"
echo "$DEST"
