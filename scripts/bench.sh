#!/usr/bin/env bash
# The benchmark of docs/performance.md, exactly as it was run:
#
#   bash scripts/bench.sh [ROUNDS] [extra criu_bench options...]     (as root)
#
# 1. fetches real CRIU 4.1.x/4.2.x into target/criu (scripts/fetch-criu.sh; a no-op once there),
# 2. builds the plugin, the mock driver, the fake cuda-checkpoint and the harness in release mode,
# 3. runs `cargo bench -p cuda-plugin --bench criu_bench -- --rounds ROUNDS` (default 5).
#
# Needs root (CRIU dumps and restores real processes). Run it on a quiet machine: every
# configuration is interleaved within each round, but absolute times still follow the load.
# Output: tables on stdout, <target-dir>/bench/criu_bench.{md,csv,json}, docs/performance.svg.
# Extra options go to the benchmark, e.g. `--criu /usr/sbin/criu`, `--sizes 1,8,32,64`,
# `--no-emulated`, `--no-scenarios`, `--no-svg` (see plugin/benches/criu_bench/main.rs).
#
# CRIU_CUDA_BENCH=custom-storage runs instead the custom-storage benchmark of docs/performance.md
# ("Custom storage against host staging"): host staging against custom storage, side by side,
# with real GiB-sized allocations and a virtual 8 x 80 GiB job (plugin/benches/
# custom_storage_bench.rs); tables on stdout and in <target-dir>/bench/custom_storage_bench.md.
#
#   CRIU_CUDA_BENCH=custom-storage bash scripts/bench.sh [ROUNDS] [custom_storage_bench options...]
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$repo"

rounds=5
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then
    rounds=$1
    shift
fi

if [ "$(id -u)" != 0 ]; then
    echo "bench.sh: warning: not root; the benchmark will skip itself" >&2
fi
if [ "${CRIU_CUDA_SKIP_FETCH:-0}" != 1 ]; then
    bash scripts/fetch-criu.sh || echo "bench.sh: warning: scripts/fetch-criu.sh failed" >&2
fi

cargo build --release -p cuda-plugin -p mock-libcuda -p fake-cuda-checkpoint -p harness
if [ "${CRIU_CUDA_BENCH:-criu}" = custom-storage ]; then
    out="${CARGO_TARGET_DIR:-$repo/target}/bench"
    mkdir -p "$out"
    cargo bench -p cuda-plugin --bench custom_storage_bench -- --rounds "$rounds" \
        --out "$out/custom_storage_bench.md" "$@"
    exit
fi
cargo bench -p cuda-plugin --bench criu_bench -- --rounds "$rounds" "$@"
