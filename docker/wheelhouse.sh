#!/usr/bin/env bash
# Fill docker/wheels/ with what the images install, from this checkout, so that `docker build`
# needs no network: docker/wheels/agentrl/ the wheels of agentrl-core and the plugins (built
# from the working tree), docker/wheels/deps/ every dependency as a wheel (torch pinned by
# constraints.txt; pip's cache makes a second run quick). Run from anywhere:
#
#   docker/wheelhouse.sh                      # core[train] + the quickstart's plugins (the CPU image)
#   docker/wheelhouse.sh ./plugins/agentrl-sampler-cross ...   # more plugin folders, or requirements
#   docker/wheelhouse.sh --agentrl-only       # only agentrl's wheels, every package (the GPU images
#                                             # install their dependencies from PyPI)
#
# The two folders are separate so that a change of agentrl's code rebuilds only the image's
# last install layer, not the dependencies. Extra pip options: PIP_* variables (e.g.
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu where the CPU torch is not local).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/docker/wheels
PYTHON=${PYTHON:-python3}
QUICKSTART=(plugins/agentrl-plugin-example plugins/agentrl-env-db plugins/agentrl-env-kg
            plugins/agentrl-env-webshop plugins/agentrl-env-alfworld)

cd "$ROOT"
if [ "${1-}" = --agentrl-only ]; then
    rm -rf "$OUT/agentrl" && mkdir -p "$OUT/agentrl"
    "$PYTHON" -m pip wheel -q --no-deps --wheel-dir "$OUT/agentrl" ./core ./plugins/agentrl-*/
    echo "wheelhouse: $(ls "$OUT/agentrl" | wc -l) agentrl wheels in $OUT/agentrl"
    exit 0
fi
# The dependencies are fetched again only when what decides them changed (the packages'
# pyproject.toml files, constraints.txt, the arguments); agentrl's own wheels are always rebuilt.
stamp=$( { cat constraints.txt core/pyproject.toml plugins/*/pyproject.toml; echo "$*"; } | sha256sum | cut -c1-16)
if [ -f "$OUT/.deps-stamp" ] && [ "$(cat "$OUT/.deps-stamp")" = "$stamp" ]; then
    rm -rf "$OUT/agentrl" && mkdir -p "$OUT/agentrl"
    "$PYTHON" -m pip wheel -q --no-deps --wheel-dir "$OUT/agentrl" ./core "${QUICKSTART[@]/#/./}" "$@"
else
    rm -rf "$OUT" && mkdir -p "$OUT/deps" "$OUT/agentrl"
    "$PYTHON" -m pip wheel -q -c constraints.txt --wheel-dir "$OUT/deps" './core[train]' "${QUICKSTART[@]/#/./}" "$@"
    mv "$OUT"/deps/agentrl_*.whl "$OUT/agentrl/"
    echo "$stamp" > "$OUT/.deps-stamp"  # outside deps/: the image copies deps/ whole
fi
echo "wheelhouse: $(ls "$OUT/agentrl" | wc -l) agentrl wheels, $(ls "$OUT/deps" | wc -l) dependencies ($(du -sh "$OUT" | cut -f1)) in $OUT"
