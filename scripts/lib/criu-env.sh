# shellcheck shell=bash
# Sourced (not run) by scripts/test.sh and scripts/main-job.sh: fetch real CRIU 4.1.x/4.2.x
# into target/criu (scripts/fetch-criu.sh, a fast no-op once present) and advertise it to the
# tests and the harness. The caller defines note() (prints one line) and runs from the
# repository root.
#
# Environment read:
#   CRIU_CUDA_SKIP_FETCH=1     do not run scripts/fetch-criu.sh (a copy already in
#                              target/criu is still advertised)
#   CRIU_CUDA_REQUIRE_CRIU=1   a failed fetch is fatal; otherwise it is a warning
#   CRIU_CUDA_CRIU_DIR         where the fetched CRIUs are (default target/criu)
#
# Environment exported (only where not already set, and only for versions that are present):
#   CRIU_CUDA_CRIU_VERSIONS    path of target/criu/versions: one line per CRIU,
#                              "<version> <absolute wrapper path>"
#   CRIU_CUDA_CRIU_4_1         wrapper of the 4.1.x CRIU (e.g. target/criu/4.1.1/criu)
#   CRIU_CUDA_CRIU_4_2         wrapper of the 4.2.x CRIU (e.g. target/criu/4.2.1/criu)
#
# Functions:
#   criu_env_setup     the fetch (or its skip) and the exports; returns 1 only when the fetch
#                      failed and CRIU_CUDA_REQUIRE_CRIU=1

criu_env_setup() {
    if [ "${CRIU_CUDA_SKIP_FETCH:-0}" = 1 ]; then
        note "CRIU_CUDA_SKIP_FETCH=1: not fetching CRIU"
    elif ! bash scripts/fetch-criu.sh; then
        if [ "${CRIU_CUDA_REQUIRE_CRIU:-0}" = 1 ]; then
            note "error: scripts/fetch-criu.sh failed and CRIU_CUDA_REQUIRE_CRIU=1" >&2
            return 1
        fi
        note "warning: scripts/fetch-criu.sh failed; what needs real CRIU will skip" >&2
    fi

    local versions ver wrapper
    versions=${CRIU_CUDA_CRIU_DIR:-$PWD/target/criu}/versions
    if [ -f "$versions" ]; then
        export CRIU_CUDA_CRIU_VERSIONS=${CRIU_CUDA_CRIU_VERSIONS:-$versions}
        while read -r ver wrapper; do
            [ -x "$wrapper" ] || continue
            case "$ver" in
            4.1 | 4.1.*) export CRIU_CUDA_CRIU_4_1=${CRIU_CUDA_CRIU_4_1:-$wrapper} ;;
            4.2 | 4.2.*) export CRIU_CUDA_CRIU_4_2=${CRIU_CUDA_CRIU_4_2:-$wrapper} ;;
            esac
        done <"$versions"
    fi
    note "CRIU_CUDA_CRIU_VERSIONS=${CRIU_CUDA_CRIU_VERSIONS:-<unset>}"
    note "CRIU_CUDA_CRIU_4_1=${CRIU_CUDA_CRIU_4_1:-<unset>}"
    note "CRIU_CUDA_CRIU_4_2=${CRIU_CUDA_CRIU_4_2:-<unset>}"
}
