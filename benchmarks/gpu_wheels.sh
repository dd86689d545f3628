#!/usr/bin/env bash
# Fills .whl/ with what benchmarks/gpu_suite.sh installs on a GPU machine that has only its image's Python
# 3.12, torch and Triton (no registry is reachable there), on a machine that reaches PyPI:
#   bash benchmarks/gpu_wheels.sh [DEST]          # DEST defaults to .whl/ (ignored by git)
# - trilm's own wheel: it maps the top-level kernels/ to trilm.kernels, which a source checkout on
#   PYTHONPATH does not provide;
# - transformers 5.24.0: the image's 5.17 cannot import LlamaForCausalLM beside a top-level kernels/ folder;
# - megatron-core 0.16.1 (a cp312 binary wheel), zstandard (binary; trilm.data imports it);
# - DeepSpeed 0.19.8: PyPI has only its sdist, so it is built here into a pure-Python wheel (DS_BUILD_OPS=0:
#   no op is prebuilt; trilm's engine uses torch's AdamW and needs none), and the GPU machine builds nothing;
#   with its requirements the image lacks (hjson, pydantic and pydantic's own).
# Binary wheels are fetched for CPython 3.12 on manylinux x86-64 whatever this machine runs. The total must
# stay under 60 MiB (the device's working-tree carry limit is 64 MiB); the script prints it and fails above.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$ROOT/.whl}
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python
else PY=python3; fi
LIMIT_MIB=60
CP312=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any --only-binary=:all:)
BINARY=(megatron-core==0.16.1 zstandard==0.25.0 pydantic-core==2.50.5)
PURE=(transformers==5.24.0 pydantic==2.14.4 annotated-types==0.8.0 typing-inspection==0.4.5
      typing-extensions==4.16.0 hjson==3.1.0)
DEEPSPEED=deepspeed==0.19.8

rm -rf "$DEST"
mkdir -p "$DEST"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== trilm (pip wheel --no-deps, from a copy of the sources: no stale build/ leaks in)"
mkdir "$work/src"
tar -C "$ROOT" --exclude=__pycache__ --exclude='*.pyc' -cf - pyproject.toml README.md trilm kernels configs \
    | tar -C "$work/src" -xf -
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "$work/src"

echo "== CPython 3.12 wheels: ${BINARY[*]} ${PURE[*]}"
"$PY" -m pip download -q --no-deps -d "$DEST" "${CP312[@]}" "${BINARY[@]}" "${PURE[@]}"

echo "== $DEEPSPEED (sdist built here into a pure wheel)"
"$PY" -m pip download -q --no-deps --no-binary=:all: -d "$work/sdist" "$DEEPSPEED"
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$work/ds" "$work"/sdist/deepspeed-*.tar.gz
ds_wheel=$(ls "$work"/ds/deepspeed-*.whl)
case "$ds_wheel" in
    *-py3-none-any.whl) cp "$ds_wheel" "$DEST"/ ;;
    *) echo "DeepSpeed built a platform wheel ($ds_wheel): not carried; the suite trains without it" ;;
esac

ls -l "$DEST"
bytes=$(du -cb "$DEST"/*.whl | tail -n 1 | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "total: $(ls "$DEST"/*.whl | wc -l) wheels, $bytes bytes (${mib} MiB, limit ${LIMIT_MIB} MiB)"
if [ "$mib" -gt "$LIMIT_MIB" ]; then
    echo "over ${LIMIT_MIB} MiB: the device carries at most 64 MiB with the working tree" >&2
    exit 1
fi
