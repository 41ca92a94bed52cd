#!/usr/bin/env bash
# Main job: build the plugin and the mocks in release mode, then run the hardware-free
# scenario matrix with the harness and print its summary. Exits with the harness's
# status. Extra arguments are passed to `harness run` after the scenario directory.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$repo"

target_dir=${CARGO_TARGET_DIR:-$repo/target}
case "$target_dir" in
/*) ;;
*) target_dir=$repo/$target_dir ;;
esac

echo "main-job.sh: cargo build --release --workspace"
cargo build --release --workspace

harness=$target_dir/release/harness
[ -x "$harness" ] || {
    echo "main-job.sh: error: $harness was not built" >&2
    exit 1
}
echo "main-job.sh: $harness run scenarios/ $*"
status=0
"$harness" run scenarios/ "$@" || status=$?
echo "main-job.sh: harness exited with status $status"
exit "$status"
