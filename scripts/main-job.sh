#!/usr/bin/env bash
# Main job: fetch real CRIU 4.1.x/4.2.x into target/criu as scripts/test.sh does
# (scripts/fetch-criu.sh, a fast no-op once present; scripts/lib/criu-env.sh), build the
# plugin and the mocks (the dev profile, the artifacts scripts/test.sh builds and tests: one
# build serves both), then run the hardware-free scenario matrix with the harness and print its
# summary. Every scenario's result is also written to target/corpus-results.json, from which
# `harness conformance --ours-from` builds this project's columns of docs/conformance.md
# without running the corpus again. Scenarios on a real CRIU that is still absent are skipped,
# and the summary says so loudly, with the command that would run them. Exits with the
# harness's status. Extra arguments are passed to `harness run` after the scenario directory.
#
# Environment read: CRIU_CUDA_SKIP_FETCH=1 (do not fetch), CRIU_CUDA_REQUIRE_CRIU=1 (a failed
# fetch is fatal, and so is a real-CRIU scenario without its CRIU), as for scripts/test.sh.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$repo"

note() { printf 'main-job.sh: %s\n' "$*"; }

target_dir=${CARGO_TARGET_DIR:-$repo/target}
case "$target_dir" in
/*) ;;
*) target_dir=$repo/$target_dir ;;
esac

# shellcheck source=scripts/lib/criu-env.sh
. scripts/lib/criu-env.sh
criu_env_setup || exit 1

note "cargo build --workspace --lib --bins"
cargo build --workspace --lib --bins

harness=$target_dir/debug/harness
[ -x "$harness" ] || {
    note "error: $harness was not built" >&2
    exit 1
}
results=$target_dir/corpus-results.json
note "$harness run --results $results scenarios/ $*"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
"$harness" run --results "$results" scenarios/ "$@" | tee "$out" || status=$?
# `harness run` marks a scenario whose real CRIU is absent "skip: no CRIU <series> found".
no_criu=$(grep -c 'skip: no CRIU' "$out" || true)
if [ "$no_criu" -gt 0 ]; then
    series=$(grep -o 'skip: no CRIU [^ ]*' "$out" | sort -u | sed 's/skip: no CRIU //' | paste -sd' ' -)
    cat <<MSG

main-job.sh: ************************************************************************
main-job.sh: WARNING: $no_criu scenario(s) on real CRIU were NOT RUN (no CRIU $series found).
main-job.sh: They are the ones closest to what users run. To fetch CRIU (into target/criu,
main-job.sh: nothing installed on the system) and run them, run:
main-job.sh:     bash scripts/fetch-criu.sh && bash scripts/main-job.sh
main-job.sh: ************************************************************************
MSG
fi
note "harness exited with status $status"
exit "$status"
