#!/usr/bin/env bash
# Idempotent set-up of the environment the book and the tests run in.
#
#   scripts/setup.sh            -> prints the python to use (last line of stdout)
#
# * Makes .venv (once). If the python that creates it already has torch or jax -- a GPU box
#   with its own CUDA builds -- the venv sees them (--system-site-packages) and they are kept:
#   nothing here ever reinstalls or upgrades torch, jax, jaxlib or flax.
# * Installs only the frameworks that are missing, at the versions in
#   requirements/cpu-frameworks.txt (torch==2.13.0 is the CPU wheel on this machine's disk;
#   triton, on Linux, for the fused kernels' tests -- a GPU build of torch brings its own).
# * Installs perfladder itself (editable) with its test and book extras.
# * With a wheel folder (.whl/ or $PERFLADDER_WHEELS) it installs from there only, for
#   machines without a package registry (see scripts/carry_wheels.sh).
# A stamp file skips all of this when nothing relevant changed.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_PY=${PYTHON:-python3}
VENV=${PERFLADDER_VENV:-.venv}
WHEELS=${PERFLADDER_WHEELS:-.whl}

log() { echo "[setup] $*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  if "$BASE_PY" -c 'import importlib.util as u, sys; sys.exit(0 if (u.find_spec("torch") or u.find_spec("jax")) else 1)' 2>/dev/null; then
    log "the base python already has torch/jax: venv inherits them (--system-site-packages)"
    "$BASE_PY" -m venv --system-site-packages "$VENV"
    # A venv made from a python that is itself a venv (the GPU image's python3 is
    # /opt/torch/.venv/bin/python3) sees the *base interpreter's* site-packages, not that
    # venv's, so --system-site-packages alone would hide torch/jax. Add the base python's
    # own site-packages after ours, .pth files included (site.addsitedir).
    base_sites=$("$BASE_PY" -c 'import site, sys; print(" ".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")')
    if [ -n "$base_sites" ]; then
      venv_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
      : > "$venv_site/_perfladder_base_env.pth"
      for s in $base_sites; do
        echo "import site; site.addsitedir('$s')" >> "$venv_site/_perfladder_base_env.pth"
      done
      log "linked the base environment's site-packages: $base_sites"
    fi
    if ! "$VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(0 if (u.find_spec("torch") or u.find_spec("jax")) else 1)'; then
      log "ERROR: $VENV does not see the base python's torch/jax; refusing to install CPU frameworks over a GPU setup"
      exit 1
    fi
  else
    "$BASE_PY" -m venv "$VENV"
  fi
fi
PY="$VENV/bin/python"

PIP_ARGS=(-q --disable-pip-version-check)
if [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  # The folder is made for one python (scripts/carry_wheels.sh: CPython 3.12); on the machine
  # that made it, with another python, it would only get in the way of the registry.
  pytag=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  if ls "$WHEELS"/*-"$pytag"-"$pytag"-*.whl >/dev/null 2>&1 || ! ls "$WHEELS"/*-cp3*-cp3*-*.whl >/dev/null 2>&1; then
    log "installing from wheel folder $WHEELS (no index)"
    PIP_ARGS+=(--no-index --find-links "$WHEELS")
  else
    log "wheel folder $WHEELS holds wheels for another python than $pytag: not used"
  fi
fi

stamp_src=$(cat pyproject.toml requirements/cpu-frameworks.txt scripts/setup.sh | sha1sum | cut -c1-16)
STAMP="$VENV/.perfladder-setup-$stamp_src"
if [ -f "$STAMP" ] && "$PY" -c 'import perfladder' 2>/dev/null; then
  log "environment up to date ($VENV)"
  echo "$PY"; exit 0
fi

# Frameworks: install each one only if it is missing; never touch one that is there.
missing=$("$PY" - <<'PY'
import importlib.util as u, platform
need = {"torch": ["torch"], "jax": ["jax", "flax", "optax"]}
if platform.system() == "Linux" and platform.machine() in ("x86_64", "aarch64"):
    need["triton"] = ["triton"]          # the fused kernels' tests (interpreter on CPU)
pins = {}
for line in open("requirements/cpu-frameworks.txt"):
    line = line.split("#")[0].strip()
    if line:
        pins[line.split("==")[0]] = line
out = []
for mods in need.values():
    for m in mods:
        if u.find_spec(m) is None:
            out.append(pins[m])
# jax, flax and optax come as a set: if jax is missing, take the pinned trio together
print(" ".join(out))
PY
)
if [ -n "$missing" ]; then
  log "installing missing frameworks: $missing"
  "$PY" -m pip install "${PIP_ARGS[@]}" $missing
else
  log "frameworks present, kept as they are: $("$PY" -c 'import torch, jax, flax; print("torch", torch.__version__, "jax", jax.__version__, "flax", flax.__version__)')"
fi

log "installing perfladder (editable) with test and book extras"
"$PY" -m pip install "${PIP_ARGS[@]}" -e ".[test,book]"
rm -f "$VENV"/.perfladder-setup-*
touch "$STAMP"
echo "$PY"
