#!/usr/bin/env bash
# Sets up everything cpkv needs, idempotently: Debian libraries for Mooncake's wheel, a
# virtual environment in .venv, torch as the CPU build, cpkv with its dev tools, the pinned
# sglang wheel in .whl/ (read as data), and SGLang's CP path importable on this CPU (the
# wheel with --no-deps plus requirements-sglang.txt; CPKV_SKIP_SGLANG=1 skips that step).
# Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
TORCH_VERSION=2.13.0
SGLANG_VERSION=0.5.23

need_debs=()
for deb in libibverbs1 libnuma1; do
    dpkg-query -W -f='${Status}' "$deb" 2>/dev/null | grep -q "install ok installed" || need_debs+=("$deb")
done
if ((${#need_debs[@]})); then
    echo "setup: installing Debian packages: ${need_debs[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_debs[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi

# NOTE: torch is pinned to the CPU build: a bare or open-ended torch pulls a multi-GB CUDA
# build. On a GPU machine install the matching CUDA build of the same version instead.
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    echo "setup: installing torch==$TORCH_VERSION (CPU build)"
    "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION"
fi

stamp="$VENV/.cpkv-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "setup: installing cpkv and its dev tools into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check -e ".[dev,pd]"
    touch "$stamp"
fi

# NOTE: tests/test_sglang_table.py reads SGLang's flag declarations out of this wheel (ast, no
# import: its runtime needs CUDA) and fails when flags/sglang/data/sglang-$SGLANG_VERSION.json drifts
# from them. The wheel is cp311 manylinux x86_64 whatever this machine is: it is only read.
if ! compgen -G ".whl/sglang-$SGLANG_VERSION-*.whl" >/dev/null; then
    echo "setup: downloading the sglang==$SGLANG_VERSION wheel into .whl/ (read as data)"
    "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.11 --platform manylinux_2_34_x86_64 -d .whl "sglang==$SGLANG_VERSION"
fi

# NOTE: the plugin's tests run SGLang's own CP code from this wheel on the CPU. Everything is
# installed with --no-deps: the wheel pins torch 2.14.1 (a CUDA build) and torchvision, and a
# resolver would replace torch 2.13.0 CPU. requirements-sglang.txt pins what the path imports;
# the torchvision stand-in (scripts/sglang_standins) goes in only where no torchvision is.
sglang_stamp="$VENV/.cpkv-sglang-installed"
if [ "${CPKV_SKIP_SGLANG:-0}" != 1 ] && { [ ! -f "$sglang_stamp" ] \
    || [ requirements-sglang.txt -nt "$sglang_stamp" ] \
    || [ -n "$(find scripts/sglang_standins -newer "$sglang_stamp" -type f \
        -not -path '*/build/*' -not -path '*.egg-info/*' | head -1)" ]; }; then
    echo "setup: installing sglang==$SGLANG_VERSION (--no-deps) and the packages its CP path imports"
    pip_quiet=("$VENV/bin/pip" install -q --disable-pip-version-check --no-deps)
    "${pip_quiet[@]}" -r requirements-sglang.txt
    if ! "$VENV/bin/python" -c "import importlib.metadata as m; m.version('torchvision')" 2>/dev/null \
        || "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit('standin' not in m.version('torchvision'))"; then
        "${pip_quiet[@]}" --no-build-isolation ./scripts/sglang_standins
    fi
    "${pip_quiet[@]}" .whl/sglang-"$SGLANG_VERSION"-*.whl
    touch "$sglang_stamp"
fi
