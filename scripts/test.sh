#!/usr/bin/env bash
# The test command: Rust unit/property tests, then the end-to-end suite (tests/python), which
# runs the release binary on loopback against the real C++ RocketMQ client (PyPI rocketmq 0.4.4).
# Needs only Rust and Python 3 (with venv); idempotent. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)

python=${PYTHON:-python3}
venv=.venv
if [ ! -x "$venv/bin/python" ]; then
    echo "==> creating $venv"
    if ! "$python" -m venv "$venv"; then
        echo "error: '$python -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2
        rm -rf "$venv"
        exit 1
    fi
fi
if ! "$venv/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as metadata, sys
sys.exit(0 if metadata.version("rocketmq") == "0.4.4" and metadata.version("pytest")
         and metadata.version("pytest-xdist") == "3.8.0" and metadata.version("fusepy") else 1)
PY
then
    echo "==> installing test requirements into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
fi

# What the end-to-end suite drives besides the C++ client: Node.js's ali-ons (tests/node, from
# the npm registry, pinned by its lockfile), openssl (TLS), a Prometheus server (metrics),
# headless Chromium (the web console) and libfuse2 (fusepy's library: the disk that loses
# power in test_power_loss.py).
# Installed when missing, as root with apt-get; a test whose tool is still missing says so and
# is reported as skipped (-rs).
missing=()
command -v npm >/dev/null || missing+=(nodejs npm)
command -v openssl >/dev/null || missing+=(openssl)
command -v prometheus >/dev/null || missing+=(prometheus)
command -v chromium >/dev/null || missing+=(chromium)
ldconfig -p 2>/dev/null | grep 'libfuse\.so\.2' >/dev/null || missing+=(libfuse2)
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "==> apt-get install ${missing[*]}"
    install=(apt-get install -y -q --no-install-recommends "${missing[@]}")
    DEBIAN_FRONTEND=noninteractive "${install[@]}" >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive "${install[@]}" >/dev/null; } \
        || echo "warning: could not install ${missing[*]}" >&2
fi
if command -v npm >/dev/null && [ ! -d tests/node/node_modules/ali-ons ]; then
    echo "==> npm ci (tests/node: ali-ons)"
    (cd tests/node && npm ci --no-audit --no-fund --silent) \
        || echo "warning: npm ci in tests/node failed" >&2
fi

# The tests drive the store's fault hooks (a slow disk, failed writes): they are compiled in
# only with the fault-injection feature, never in a production build.
features="shardmq/fault-injection,shards/fault-injection"
# One build for everything: the `ci` profile is release that unwinds (Cargo.toml), so the test
# binaries and the shardmq binary the suites run share each dependency's build (under release's
# panic = "abort" every dependency was built twice, for the binary and for the test harness).
profile=ci
echo "==> cargo fmt --check, cargo clippy -D warnings"
cargo fmt --all -- --check
cargo clippy --profile "$profile" --workspace --all-targets --features "$features" -- -D warnings
echo "==> cargo test --profile $profile --workspace (builds target/$profile/shardmq too, with the test-only fault hooks)"
cargo test --profile "$profile" --workspace --features "$features" --no-run
# Both suites run even when the first fails, so one run shows every failure; either fails it.
cargo_status=0
cargo test --profile "$profile" --workspace --features "$features" --no-fail-fast || cargo_status=$?
# The end-to-end tests spend most of their time waiting on clients (route polls, rebalances,
# delay levels), not on the CPU: SHARDMQ_TEST_WORKERS (default 3) run them side by side, the
# long ones first, each test handed to a worker as one frees up; 1 runs them one after another.
workers=${SHARDMQ_TEST_WORKERS:-3}
parallel=()
[ "$workers" -gt 1 ] && parallel=(-n "$workers" --dist load --maxschedchunk 1)
echo "==> pytest tests/python (${workers} worker(s))"
pytest_status=0
SHARDMQ_BIN=${SHARDMQ_BIN:-$PWD/target/$profile/shardmq} \
    "$venv/bin/python" -m pytest -q -rs --durations=10 "${parallel[@]}" tests/python "$@" \
    || pytest_status=$?

elapsed=$(( $(date +%s) - started ))
if [ "$cargo_status" -ne 0 ] || [ "$pytest_status" -ne 0 ]; then
    echo "==> FAILED after ${elapsed} s: cargo test exit ${cargo_status}, pytest exit ${pytest_status}" >&2
    exit 1
fi
echo "==> all tests passed in ${elapsed} s"
