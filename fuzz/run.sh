#!/usr/bin/env bash
# Run the fuzz targets under atheris, each for a bounded time, one at a time.
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 12 s each, all targets)
# CI runs the default (about a minute in all); a long run is e.g. `nice -n 19 fuzz/run.sh 600 gguf`.
# Crashes are written to fuzz/artifacts/<target>/; copy one into fuzz/regressions/<target>/ once fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
secs=${1:-12}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf tokenizer template grammar requests)
for t in "${targets[@]}"; do
    mkdir -p "fuzz/artifacts/$t"
    echo "== fuzz $t for ${secs}s"
    log="fuzz/artifacts/$t/last.log"
    status=0
    # a hard cap on address space too: an allocation a check misses fails instead of eating the machine
    ( ulimit -v $((4 * 1024 * 1024)); exec "$PY" "fuzz/fuzz_$t.py" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2560 -max_len=65536 \
        -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$t/" ) >"$log" 2>&1 || status=$?
    grep -E "^stat::(number_of_executed_units|new_units_added|peak_rss_mb)|Error|ERROR|Test unit written" "$log" || true
    [ "$status" -eq 0 ] || { echo "fuzz target $t failed (exit $status); see $log"; exit 1; }
done
