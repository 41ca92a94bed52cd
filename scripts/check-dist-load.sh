#!/usr/bin/env bash
# Loads the release plugin where the release notes claim it works:
#
#   1. glibc: packaging/load-check.c, built with Zig for glibc 2.17, dlopen()s each tarball's
#      cuda_plugin.so with RTLD_NOW (every symbol bound at once), checks that CR_PLUGIN_DESC is
#      named cuda_plugin and that CR_PLUGIN_OPTIONS_META is readable, and calls nothing else.
#      It runs under Debian's glibc packages, fetched with a private apt configuration
#      (scripts/lib/private-apt.sh, as scripts/fetch-criu.sh fetches CRIU) into
#      target/dist-check/glibc/<suite>-<arch>/ and started through that glibc's own dynamic
#      loader (--library-path), so no host library is used:
#        - bullseye's libc6 (glibc 2.31), required;
#        - buster's (2.28, RHEL/Alma 8's level) from archive.debian.org, when that answers
#          (otherwise reported as skipped, with the reason);
#        - x86_64 also on the host's own glibc.
#      The aarch64 plugin runs the same way under qemu-user's qemu-aarch64. Each tarball's
#      cuda-plugin-doctor runs (`--version`) on each of those glibcs too.
#   2. real CRIU (x86_64, root): the scenario corpus's real-CRIU variants
#      (harness/tests/scenarios.rs, `-- '[criu]'`) and plugin/tests/real_criu.rs (what the corpus
#      cannot express: CRIU killed mid-run, an unprivileged CRIU, ...), both with
#      CRIU_CUDA_TEST_PLUGIN_SO pointing at the tarball's .so, under Debian's CRIU 4.1.x and
#      4.2.x from scripts/fetch-criu.sh: CUDA process trees in a mock world dumped and restored
#      through the driver-api and the cuda-checkpoint backends, and the failure cases (lock and
#      checkpoint failures, timeouts, --leave-running, ...), each transcript checked against its
#      snapshot (~2 min).
#
# Ends with one line per check and its result; exits 1 when one failed.
#
# Usage: scripts/check-dist-load.sh [--skip-criu] [TARBALL...]
#   TARBALL      release tarballs (default: target/dist/criu-cuda-plugin-<version>-*.tar.gz)
#   --skip-criu  skip step 2 (it needs root and scripts/fetch-criu.sh)
# Needs: Debian tools apt-get and dpkg-deb, debian-archive-keyring, qemu-user (for aarch64),
# and the tools of scripts/dist.sh (installed on first use).
# Environment:
#   CARGO_TARGET_DIR          as for cargo (default: <repo>/target)
#   CRIU_CUDA_DEBIAN_MIRROR   Debian mirror (default: http://deb.debian.org/debian)
#   CRIU_CUDA_DEBIAN_ARCHIVE  archive of old releases (default: http://archive.debian.org/debian)
set -euo pipefail

die() {
    printf 'check-dist-load: error: %s\n' "$*" >&2
    exit 1
}
say() { printf 'check-dist-load: %s\n' "$*"; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$repo"

skip_criu=0
tarballs=()
for arg in "$@"; do
    case "$arg" in
    --skip-criu) skip_criu=1 ;;
    -h | --help)
        usage
        exit 0
        ;;
    -*) die "unknown option '$arg' (try --help)" ;;
    *) tarballs+=("$arg") ;;
    esac
done

target_dir=${CARGO_TARGET_DIR:-$repo/target}
case "$target_dir" in
/*) ;;
*) target_dir=$repo/$target_dir ;;
esac
if [ "${#tarballs[@]}" = 0 ]; then
    version=$(bash scripts/dist.sh --print-version) || die "cannot read the version (scripts/dist.sh --print-version)"
    for t in "$target_dir/dist/criu-cuda-plugin-$version-"*-linux-gnu.tar.gz; do
        [ -f "$t" ] && tarballs+=("$t")
    done
    [ "${#tarballs[@]}" -gt 0 ] ||
        die "no tarball of version $version in $target_dir/dist (run scripts/dist.sh first)"
fi

mirror=${CRIU_CUDA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
archive=${CRIU_CUDA_DEBIAN_ARCHIVE:-http://archive.debian.org/debian}
keyrings=/usr/share/keyrings
# The old glibc releases, oldest first: "<suite> <mirror> <keyring> <required: yes|no>".
# buster's keys are among the removed ones since bookworm; archive.debian.org's Release files
# have expired, so their dates are not checked there (the signatures are).
glibc_suites=(
    "buster $archive $keyrings/debian-archive-removed-keys.gpg no"
    "bullseye $mirror $keyrings/debian-archive-keyring.gpg yes"
)

work=$target_dir/dist-check
mkdir -p "$work"

# shellcheck source=scripts/lib/dist-tools.sh
. "$repo/scripts/lib/dist-tools.sh"
# shellcheck source=scripts/lib/private-apt.sh
. "$repo/scripts/lib/private-apt.sh"
dist_tools_setup "$target_dir"

results=()
failed=0
result() {
    results+=("$1: $2")
    case "$2" in
    ok*) ;;
    skipped*) ;;
    *) failed=1 ;;
    esac
}

# sysroot SUITE MIRROR KEYRING DEBARCH: unpack SUITE's libc6 for DEBARCH (once) and print the
# directory; fails (without exiting) when the suite cannot be fetched, with the reason on
# stderr.
sysroot() {
    local suite=$1 mirror=$2 keyring=$3 debarch=$4
    local dir=$work/glibc/$suite-$debarch
    if [ -f "$dir/root/.fetched" ]; then
        printf '%s' "$dir/root"
        return 0
    fi
    [ -r "$keyring" ] || {
        echo "keyring $keyring not found (apt-get install debian-archive-keyring)" >&2
        return 1
    }
    (
        rm -rf "$dir"
        mkdir -p "$dir"
        opts=""
        [ "$mirror" = "$archive" ] && opts=" check-valid-until=no"
        private_apt_setup "$dir/apt" "$debarch" \
            "deb [arch=$debarch signed-by=$keyring$opts] $mirror $suite main"
        private_apt_update "$dir/apt"
        private_apt_unpack "$dir/apt" "$suite" "$dir/root.tmp" libc6
        printf '%s\n' "$PRIVATE_APT_PACKAGES" >"$dir/root.tmp/.fetched"
        mv "$dir/root.tmp" "$dir/root"
    ) >"$work/glibc-$suite-$debarch.log" 2>&1 || {
        # The first problem apt or the helper reported says why.
        grep -E '^(E|W): |error: ' "$work/glibc-$suite-$debarch.log" | head -n 1 >&2
        return 1
    }
    printf '%s' "$dir/root"
}

# run_check LABEL EXPECTED_GLIBC COMMAND...: runs a load check, records its result.
run_check() {
    local label=$1 want=$2 out
    shift 2
    if out=$("$@" 2>&1); then
        printf '%s\n' "$out" | sed 's/^/    /'
        if ! grep -q "^load-check: glibc $want " <<<"$out"; then
            result "$label" "FAILED: ran on another glibc than $want"
        elif grep -qx 'load-check: ok' <<<"$out"; then
            result "$label" "ok"
        else
            result "$label" "FAILED: no 'load-check: ok'"
        fi
    else
        printf '%s\n' "$out" | sed 's/^/    /'
        result "$label" "FAILED: $(tail -n1 <<<"$out")"
    fi
}

# run_doctor LABEL COMMAND...: the tarball's cuda-plugin-doctor starts (`--version`) where the
# plugin loads, records the result.
run_doctor() {
    local label=$1 out
    shift
    if out=$("$@" --version 2>&1) && grep -q '^cuda-plugin-doctor [0-9]' <<<"$out"; then
        printf '    %s\n' "$out"
        result "$label" "ok"
    else
        printf '%s\n' "$out" | sed 's/^/    /'
        result "$label" "FAILED: $(tail -n1 <<<"$out")"
    fi
}

x86_so=""
for tarball in "${tarballs[@]}"; do
    base=$(basename "$tarball")
    [[ "$base" =~ ^criu-cuda-plugin-.*-(x86_64|aarch64)-linux-gnu\.tar\.gz$ ]] ||
        die "$tarball is not a release tarball (criu-cuda-plugin-<version>-<arch>-linux-gnu.tar.gz)"
    arch=${BASH_REMATCH[1]}
    name=${base%.tar.gz}
    rm -rf "${work:?}/$name"
    tar -xzf "$tarball" -C "$work" || die "unpacking $tarball failed"
    so=$work/$name/cuda_plugin.so
    [ -f "$so" ] || die "$tarball has no $name/cuda_plugin.so"

    loader=$work/load-check-$arch
    dist_zig cc -target "$arch-linux-gnu.2.17" -O2 -Wall -Wextra -Werror \
        -o "$loader" packaging/load-check.c || die "building packaging/load-check.c for $arch failed"

    case "$arch" in
    x86_64) debarch=amd64 ld=ld-linux-x86-64.so.2 ;;
    aarch64) debarch=arm64 ld=ld-linux-aarch64.so.1 ;;
    esac
    emulator=()
    if [ "$arch" != "$(uname -m)" ]; then
        case "$arch" in
        aarch64) command -v qemu-aarch64 >/dev/null 2>&1 ||
            die "qemu-aarch64 not found: it runs the aarch64 load checks (Debian: apt-get install qemu-user)" ;;
        *) die "cannot run $arch code on $(uname -m)" ;;
        esac
        emulator=(qemu-aarch64)
        say "$name: running under $(qemu-aarch64 --version | head -n1)"
    else
        host_glibc=$(getconf GNU_LIBC_VERSION | sed 's/^glibc //')
        say "$name: load check on the host's glibc $host_glibc"
        run_check "$arch on the host's glibc $host_glibc" "$host_glibc" "$loader" "$so" cuda_plugin
        run_doctor "$arch cuda-plugin-doctor on the host's glibc $host_glibc" "$work/$name/cuda-plugin-doctor"
    fi

    for entry in "${glibc_suites[@]}"; do
        read -r suite suite_mirror keyring required <<<"$entry"
        label="$arch on Debian $suite's glibc"
        if ! root=$(sysroot "$suite" "$suite_mirror" "$keyring" "$debarch" 2>"$work/why"); then
            why=$(tr '\n' ' ' <"$work/why")
            if [ "$required" = yes ]; then
                result "$label" "FAILED: cannot fetch $suite's libc6 from $suite_mirror: $why"
            else
                result "$label" "skipped: $suite's libc6 could not be fetched from $suite_mirror: ${why:-see $work/glibc-$suite-$debarch.log}"
            fi
            continue
        fi
        libc6=$(sed -n 's/^libc6=//p' "$root/.fetched")
        want=${libc6%%-*}
        label="$arch on Debian $suite's glibc $want (libc6 $libc6)"
        libdir=$root/lib/$arch-linux-gnu
        [ -e "$libdir/$ld" ] || libdir=$root/usr/lib/$arch-linux-gnu
        [ -e "$libdir/$ld" ] || {
            result "$label" "FAILED: no $ld in $suite's libc6"
            continue
        }
        say "$name: load check on $suite's glibc $want"
        run_check "$label" "$want" "${emulator[@]}" "$libdir/$ld" --library-path "$libdir" \
            "$loader" "$so" cuda_plugin
        run_doctor "$arch cuda-plugin-doctor on Debian $suite's glibc $want" "${emulator[@]}" \
            "$libdir/$ld" --library-path "$libdir" "$work/$name/cuda-plugin-doctor"
    done
    [ "$arch" = x86_64 ] && x86_so=$so
done

if [ "$skip_criu" = 1 ]; then
    result "real CRIU dump and restore" "skipped: --skip-criu"
elif [ -z "$x86_so" ]; then
    result "real CRIU dump and restore" "skipped: no x86_64 tarball"
elif [ "$(id -u)" != 0 ]; then
    result "real CRIU dump and restore" "FAILED: needs root (or --skip-criu)"
else
    say "real CRIU: cargo test -p harness --test scenarios -- '[criu]' and cargo test -p cuda-plugin --test real_criu, with CRIU_CUDA_TEST_PLUGIN_SO=$x86_so"
    label="x86_64 under real CRIU: the corpus's real-CRIU scenarios and plugin/tests/real_criu.rs"
    log=$work/real-criu-scenarios.log
    if CRIU_CUDA_TEST_PLUGIN_SO=$x86_so CRIU_CUDA_REQUIRE_CRIU=1 INSTA_UPDATE=no \
        cargo test -p harness --test scenarios -- '[criu]' >"$log" 2>&1 &&
        log=$work/real-criu.log &&
        CRIU_CUDA_TEST_PLUGIN_SO=$x86_so CRIU_CUDA_REQUIRE_CRIU=1 \
            cargo test -p cuda-plugin --test real_criu >"$log" 2>&1; then
        grep -E '^scenarios: the plugin|^test result' "$work/real-criu-scenarios.log" | sed 's/^/    /'
        grep -E '^real_criu: (CRIU|plugin)|^test result' "$work/real-criu.log" | sed 's/^/    /'
        # One line per scenario variant: "test [criu] criu/dump-and-restore@criu-4.1,driver-api ... ok".
        rows=$(grep -E '^test \[criu\] +criu/dump-and-restore@criu-4\.[12],(driver-api|cuda-checkpoint) +\.\.\. ok' "$work/real-criu-scenarios.log" || true)
        versions=$(grep -o 'criu-4\.[12]' <<<"$rows" | sort -uV | paste -sd' ' -)
        n=$(sed -n 's/^test result: ok\. \([0-9]*\) passed.*/\1/p' "$work/real-criu-scenarios.log" | tail -n1)
        t=$(sed -n 's/^test result: ok\. \([0-9]*\) passed.*/\1/p' "$work/real-criu.log" | tail -n1)
        if [ "$(grep -c . <<<"$rows")" = 4 ]; then
            result "$label" "ok ($n scenarios and $t trials; criu/dump-and-restore under $versions with both backends)"
        else
            result "$label" "FAILED: want criu/dump-and-restore to pass on 2 CRIU versions x 2 backends, got: $(tr '\n' ';' <<<"$rows") (log $work/real-criu-scenarios.log)"
        fi
    else
        tail -n 60 "$log" | sed 's/^/    /'
        result "$label" "FAILED (log $log)"
    fi
fi

say "results:"
for r in "${results[@]}"; do
    printf '  %s\n' "$r"
done
[ "$failed" = 0 ] || die "some load checks failed (above)"
say "all load checks passed"
