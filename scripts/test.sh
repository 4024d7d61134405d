#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh machine, then run it.
# System packages (Debian): tmux, for the terminal tests that drive a real terminal; the aarch64
# cross compiler and qemu-user, to build the ARM NEON kernels and run their self-test here;
# libsimde-dev, to run the AVX-512 kernels' self-test on CPUs without AVX-512.
# Python: a venv with the test and fuzz extras and MLX (its CPU build on Linux: the mlx backend's tests).
# Before the tests, each fuzz target runs briefly (LLMEDGE_FUZZ_SECONDS each, default 12; 0 skips);
# a long run is `nice -n 19 fuzz/run.sh 600 <target>` (see fuzz/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v tmux >/dev/null || missing+=(tmux)
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
[ -f /usr/include/simde/x86/avx512.h ] || missing+=(libsimde-dev)
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
python3 -m venv .venv
.venv/bin/pip install -q -e '.[test,fuzz,mlx]'
fuzz_seconds=${LLMEDGE_FUZZ_SECONDS:-12}
if [ "$fuzz_seconds" != 0 ]; then
    fuzz/run.sh "$fuzz_seconds"
fi
exec .venv/bin/python -m pytest -q --durations=15 "$@" </dev/null  # no test waits on an inherited stdin pipe
