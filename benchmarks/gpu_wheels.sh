#!/usr/bin/env bash
# Wheels for a GPU machine that reaches no package index (the GPU machines lent to this project
# reach nothing outside): the packages that the GPU check needs and such a machine's image lacks
# (its Python has torch, Lightning, pytest, pandas, seaborn, ... but no pydantic), for Python 3.12
# on x86-64 Linux, at the versions of this checkout's .venv (those the tests here ran with).
# `bash benchmarks/gpu_check.sh --wheels DIR` installs from them.
#
#   bash benchmarks/gpu_wheels.sh [DIR]      # default .whl, added to git's exclude list (not committed)
#   PY_VERSION=3.11 bash benchmarks/gpu_wheels.sh /tmp/wheels   # for another Python (a rehearsal here)
#
# Not carried: Ray, wandb and MLflow (with their dependencies some hundred MB, over what travels
# with the working tree); no step of the GPU check imports them, and check.json names the dev
# requirements the install left out.
set -eu
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PYTHON=${PYTHON:-.venv/bin/python}
PY_VERSION=${PY_VERSION:-3.12}  # the GPU machine's python3
PACKAGES=(
  setuptools                                                    # the build backend, >= 77 (pyproject)
  pydantic pydantic-core annotated-types typing-inspection typing-extensions   # runtime
  jsonschema jsonschema-specifications referencing rpds-py      # dev extra
  lion-pytorch                                                  # dev extra (train.optimizer: lion)
  x-transformers einx loguru frozendict torch-einops-utils      # bench extra: the benchmark's decode section
)
pins=$("$PYTHON" - "${PACKAGES[@]}" <<'EOF'
import sys
from importlib import metadata
try:
    print(" ".join(f"{name}=={metadata.version(name)}" for name in sys.argv[1:]))
except metadata.PackageNotFoundError as err:
    sys.exit(f"gpu_wheels.sh: {err} is not installed in this Python ({sys.executable}): run `make install` first")
EOF
)
mkdir -p "$DIR"
# shellcheck disable=SC2086 # pins is a list of NAME==VERSION
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DIR" $pins
exclude=$(git rev-parse --git-path info/exclude 2>/dev/null) && [[ $DIR != /* ]] \
  && ! git check-ignore -q "$DIR" && echo "/$DIR/" >>"$exclude"
echo "$(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR"
