#!/usr/bin/env bash
# The reference machine's runs (docs/performance.md): the write path pinned to 2 cores,
# then on 16 cores, each benchmark against its own embedded servers, one after another.
#   bench/reference.sh [2] [16]      which sets (default both); output under artifacts/bench/
#   PY=...                           the interpreter (default .venv/bin/python)
#   SHORT=1                          the short settings of `make bench` (else longer runs)
set -o pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p artifacts/bench
if [ -n "$SHORT" ]; then
    api_time="--duration 5 --warmup 2 --rounds 3"; ledger_time="--seconds 5 --warm-up 2"
else
    # 10 s of warm-up: on a fresh cluster the first seconds create WAL segments and run on
    # plans made on empty tables (docs/performance.md, "The reference machine").
    api_time="--duration 8 --warmup 10 --rounds 3"; ledger_time="--seconds 8 --warm-up 3"
fi

run() {  # run NAME CPUS ARGS...: one benchmark under the stack, its output kept
    local name=$1 cpus=$2; shift 2
    local pin=() out="artifacts/bench/$name.txt"
    [ -n "$cpus" ] && pin=(taskset -c "$cpus")
    echo "== $name: $*"
    "${pin[@]}" "$PY" scripts/stack.py run -- python "$@" 2>&1 | grep -v Warning | tee "$out"
}

for set in "${@:-2 16}"; do
    for cores in $set; do
        if [ "$cores" = 2 ]; then
            run api-2cores 0,1 bench/api.py $api_time --cpus 0,1
            run ledger-2cores 0,1 bench/ledger.py $ledger_time --cpus 0,1
        else
            run api-16cores "" bench/api.py $api_time \
                --server-workers 16 --processes 8 --threads 16
            run ledger-16cores "" bench/ledger.py $ledger_time --clients 64 --client-processes 16
        fi
    done
done
