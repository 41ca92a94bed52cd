#!/usr/bin/env bash
# All tests: fetch real CRIU 4.1.x/4.2.x into target/criu (scripts/fetch-criu.sh; a
# fast no-op once present; scripts/lib/criu-env.sh, shared with scripts/main-job.sh),
# then `cargo test --workspace --all-targets` and the doctests. Exits non-zero on any failure.
#
# Environment read:
#   CRIU_CUDA_SKIP_FETCH=1     do not run scripts/fetch-criu.sh (a copy already in
#                              target/criu is still advertised below)
#   CRIU_CUDA_REQUIRE_CRIU=1   a failed fetch is fatal (CI sets this); otherwise it is
#                              a warning and tests that need real CRIU skip themselves.
#                              Passed through to the tests unchanged.
#   CRIU_CUDA_REQUIRE_DIST=1   the docs check fails, instead of skipping, the README's
#                              release-tarball block when scripts/dist.sh has not built
#                              this version's tarballs (CI sets this). Passed through.
#   CRIU_CUDA_REQUIRE_C_PLUGINS=1  the tests of CRIU's C plugins (harness/tests/criu_symbols.rs,
#                              harness/tests/kit.rs) fail, instead of being ignored, when
#                              scripts/fetch-criu.sh --c-plugin has not built them (CI sets
#                              this). Passed through.
#   CRIU_CUDA_REQUIRE_RUNC=1   plugin/tests/runc.rs fails, instead of skipping, when runc is
#                              not installed (CI sets this; a set CI variable does the same).
#                              Passed through.
#   CRIU_CUDA_REQUIRE_PODMAN=1 plugin/tests/podman.rs fails, instead of skipping, when podman is
#                              not installed (CI sets this; a set CI variable does the same).
#                              Passed through.
#   CRIU_CUDA_CORPUS_IN_MAIN_JOB=1  harness/tests/scenarios.rs runs no scenario: the corpus runs
#                              in scripts/main-job.sh instead (CI sets this). Passed through.
#   --full                     (first argument) the full mode, for a nightly or manual run:
#                              sets CRIU_CUDA_FULL=1, which runs the fault sweep with every code
#                              and the slow faults everywhere (harness sweep --full) and the
#                              restore-thread stress test (mock-libcuda/tests/restore_thread_stress.rs,
#                              CRIU_CUDA_STRESS_RUNS cycles, default 500)
#   extra arguments            passed to both `cargo test` runs (e.g. -- --nocapture)
#
# Environment exported to the tests:
#   CRIU_CUDA_ARTIFACTS        the profile directory (target/debug, under CARGO_TARGET_DIR
#                              when set) where this script first builds every library and
#                              program (`cargo build --workspace --lib --bins`): the tests take
#                              their artifacts from there and run no nested `cargo build`.
#                              Set it yourself to test other artifacts.
# and, only where not already set and only for versions that are present:
#   CRIU_CUDA_CRIU_VERSIONS    path of target/criu/versions: one line per CRIU,
#                              "<version> <absolute wrapper path>"
#   CRIU_CUDA_CRIU_4_1         wrapper of the 4.1.x CRIU (e.g. target/criu/4.1.1/criu)
#   CRIU_CUDA_CRIU_4_2         wrapper of the 4.2.x CRIU (e.g. target/criu/4.2.1/criu)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$repo"

note() { printf 'test.sh: %s\n' "$*"; }

if [ "${1:-}" = --full ]; then
    shift
    export CRIU_CUDA_FULL=1
    note "full mode (CRIU_CUDA_FULL=1): the full fault sweep and the restore-thread stress test"
fi

# shellcheck source=scripts/lib/criu-env.sh
. scripts/lib/criu-env.sh
criu_env_setup || exit 1
if [ "$(id -u)" != 0 ]; then
    note "warning: not root; tests that ptrace or run CRIU may skip or fail"
fi

if [ -z "${CRIU_CUDA_ARTIFACTS:-}" ]; then
    note "cargo build --workspace --lib --bins (the artifacts the tests run)"
    cargo build --workspace --lib --bins
    target=${CARGO_TARGET_DIR:-target}
    case $target in /*) ;; *) target=$repo/$target ;; esac
    export CRIU_CUDA_ARTIFACTS="$target/debug"
fi
note "CRIU_CUDA_ARTIFACTS=$CRIU_CUDA_ARTIFACTS"
note "cargo test --workspace --all-targets $*"
cargo test --workspace --all-targets "$@"
note "cargo test --workspace --doc $*"
cargo test --workspace --doc "$@"
note "all tests passed"
