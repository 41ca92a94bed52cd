#!/usr/bin/env bash
# Fetch Debian's CRIU 4.1.x (trixie) and 4.2.x (sid, falling back to forky) into
# target/criu/<version>/ without changing the system.
#
# The CI host (Debian bookworm) only packages CRIU 3.17, and its glibc (2.36) is too
# old for Debian's 4.x criu binaries (they need GLIBC_2.38). So for each series this script
#   1. resolves `criu` and its full run-time dependency closure (libc6 included) in
#      the chosen Debian suite, using a private apt configuration under
#      target/criu/apt (its own sources list, lists, cache and an empty dpkg status;
#      /etc/apt/sources.list* and /var/lib/{apt,dpkg} are never read or written),
#   2. downloads those .debs with `apt-get download` (apt checks the Release
#      signature against the Debian archive keyring and every .deb's hash),
#   3. unpacks them with `dpkg -x` into target/criu/<version>/ (nothing is installed),
#   4. writes target/criu/<version>/criu, a wrapper that starts usr/sbin/criu through
#      the bundled dynamic loader with --library-path pointing at the bundled
#      libraries, so the binary never touches the host's glibc,
#   5. checks the wrapper with `criu --version` (fatal) and, as root, `criu check`
#      (a warning only: it depends on the kernel, not on this script), and
#   6. rewrites target/criu/versions: one line per installed version,
#      "<version> <absolute wrapper path>" (split at the first space).
#
# Running it again is a fast no-op while every wrapper is present and answers
# --version. Options:
#   --force     download and unpack again even if a working copy is present (and, with
#               --c-plugin, build the C plugins again)
#   --smoke     also dump and restore a `setsid sleep` with each version (needs root)
#   --c-plugin  also build CRIU's own C cuda_plugin.so of each fetched version from Debian's
#               `criu` source package (for `harness run --plugin` and `harness conformance`):
#                 1. installs the packages the partial build needs (gcc, make, libc6-dev,
#                    pkgconf; dpkg-dev and xz-utils for `apt-get source`, binutils to check
#                    the result) with the system's apt-get, as .ci/run installs packages
#                    (root or sudo; only the missing ones),
#                 2. `apt-get source criu=<debian version>` with a private apt configuration
#                    (deb-src lines of the same suite) under target/criu/apt-src; apt checks
#                    every file against the signed Sources index. A mirror that serves the
#                    upstream tarball but not Debian's .dsc/.debian.tar.xz gets a warning and
#                    the plugin is built from that (verified) upstream tarball alone, without
#                    Debian's patches; target/criu/<version>/c-plugin/BUILD-INFO says which,
#                 3. the partial build: CRIU's version and config headers, compel's host tool
#                    (`compel-host includes` gives the plugin its include path), then
#                    `make -C plugins/cuda ARCH=x86`, upstream's own Makefile and flags,
#                 4. puts it at target/criu/<version>/c-plugin/cuda_plugin.so, checks that it
#                    is a shared object exporting CR_PLUGIN_DESC, and rewrites
#                    target/criu/c-plugins: "<version> <absolute path>" per line.
#               The system's own CRIU (if any) is not touched. A second run is a no-op.
#   -h|--help   print this help
# Environment:
#   CRIU_CUDA_CRIU_DIR        where to put everything (default: <repo>/target/criu)
#   CRIU_CUDA_DEBIAN_MIRROR   Debian mirror URL (default: http://deb.debian.org/debian)
#   CRIU_CUDA_DEBIAN_KEYRING  keyring for the Release files
#                             (default: /usr/share/keyrings/debian-archive-keyring.gpg)
set -euo pipefail

die() {
    printf 'fetch-criu: error: %s\n' "$*" >&2
    exit 1
}
say() { printf 'fetch-criu: %s\n' "$*"; }

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

force=0
smoke=0
c_plugin=0
for arg in "$@"; do
    case "$arg" in
    --force) force=1 ;;
    --smoke) smoke=1 ;;
    --c-plugin) c_plugin=1 ;;
    -h | --help)
        usage
        exit 0
        ;;
    *) die "unknown argument '$arg' (try --help)" ;;
    esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
out=${CRIU_CUDA_CRIU_DIR:-$repo/target/criu}
mirror=${CRIU_CUDA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
keyring=${CRIU_CUDA_DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}

# Each entry: "<series> <suite> [<fallback suite>...]". The first suite whose criu
# belongs to the series wins.
series_list=(
    "4.1 trixie"
    "4.2 sid forky"
)
all_suites="trixie forky sid"

marker_name=.criu-cuda-fetch

# ---------------------------------------------------------------- preconditions

[ "$(uname -s)" = Linux ] || die "Linux only (this is $(uname -s))"
[ "$(uname -m)" = x86_64 ] || die "x86-64 only (this is $(uname -m)): the script fetches amd64 packages"

mkdir -p "$out"
out=$(cd "$out" && pwd -P)

# Serialise concurrent runs (e.g. two test runs started at once).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$out/.lock"
    flock 9
fi

# ------------------------------------------------------------ idempotency check

# wrapper_version WRAPPER: print the "x.y.z" that WRAPPER --version reports, or
# nothing if it does not run.
wrapper_version() {
    local v
    v=$("$1" --version 2>/dev/null | sed -n 's/^Version: *//p' | head -n1) || true
    printf '%s' "$v"
}

# present SERIES: print the directory of a working, previously fetched copy of
# SERIES, or fail.
present() {
    local series=$1 m dir ver
    for m in "$out"/*/"$marker_name"; do
        [ -f "$m" ] || continue
        grep -qx "series=$series" "$m" || continue
        dir=$(dirname "$m")
        ver=$(sed -n 's/^version=//p' "$m")
        [ -x "$dir/criu" ] || continue
        [ "$(wrapper_version "$dir/criu")" = "$ver" ] || continue
        # Wrappers from before LD_LIBRARY_PATH was passed on are stale.
        grep -q 'LD_LIBRARY_PATH' "$dir/criu" || continue
        printf '%s' "$dir"
        return 0
    done
    return 1
}

write_versions() {
    local m dir tmp
    tmp=$(mktemp "$out/.versions.XXXXXX")
    for m in "$out"/*/"$marker_name"; do
        [ -f "$m" ] || continue
        dir=$(dirname "$m")
        printf '%s %s\n' "$(sed -n 's/^version=//p' "$m")" "$dir/criu" >>"$tmp"
    done
    sort -V -o "$tmp" "$tmp"
    mv -f "$tmp" "$out/versions"
}

todo=()
for entry in "${series_list[@]}"; do
    read -r series _ <<<"$entry"
    if [ "$force" = 0 ] && dir=$(present "$series"); then
        say "CRIU $series.x: $(basename "$dir") already present at $dir/criu (skipping; --force refetches)"
    else
        todo+=("$entry")
    fi
done

# ------------------------------------------------------------- smoke dump/restore

# smoke WRAPPER: dump a session leader `sleep` and restore it (detached).
smoke() {
    local criu=$1 dir pid
    [ "$(id -u)" = 0 ] || die "--smoke needs root (CRIU has to ptrace the target)"
    dir=$(mktemp -d "${TMPDIR:-/tmp}/criu-cuda-smoke.XXXXXX")
    # Start it as an orphaned session leader (so --shell-job is not needed), without
    # our lock fd 9: CRIU refuses to dump tasks holding file locks.
    pid=$(setsid sleep 1000 </dev/null >/dev/null 2>&1 9>&- & echo $!)
    sleep 0.2
    if ! "$criu" dump -t "$pid" -D "$dir" -v4 -o dump.log; then
        kill -9 "$pid" 2>/dev/null || true
        grep -E 'Error' "$dir/dump.log" >&2 || true
        die "smoke: '$criu dump -t $pid -D $dir' failed (log: $dir/dump.log)"
    fi
    # The dump kills the task; pid 1 may reap it lazily, and restoring with the same
    # pid needs it gone.
    for _ in $(seq 100); do
        [ -e "/proc/$pid" ] || break
        sleep 0.05
    done
    if ! "$criu" restore -D "$dir" -d -v4 -o restore.log; then
        grep -E 'Error' "$dir/restore.log" >&2 || true
        die "smoke: '$criu restore -D $dir -d' failed (log: $dir/restore.log)"
    fi
    [ -e "/proc/$pid" ] || die "smoke: restore succeeded but pid $pid is not running"
    kill -9 "$pid" 2>/dev/null || true
    rm -rf "$dir"
    say "smoke: dump + restore of pid $pid with $criu: ok"
}

# ------------------------------------------------------------ CRIU's C plugin

# Packages the partial build of plugins/cuda needs (only CRIU's headers, compel's host tool
# and the plugin itself are built, so of criu's library Build-Depends only libcap-dev, for the
# <sys/capability.h> that criu/include/cr_options.h includes), what `apt-get source` needs to
# unpack a source package, and readelf to check the result.
c_plugin_packages=(gcc make libc6-dev libcap-dev pkgconf dpkg-dev xz-utils binutils)

# install_build_packages: install the missing ones with the system's apt-get, as .ci/run
# does (only this step touches the system, and only to add these packages).
install_build_packages() {
    local p missing=() sudo_=""
    for p in "${c_plugin_packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ "${#missing[@]}" = 0 ] && return 0
    [ "$(id -u)" = 0 ] || sudo_=sudo
    say "C plugin: installing ${missing[*]} (system apt-get)"
    $sudo_ apt-get -q update </dev/null >/dev/null || die "apt-get update failed"
    $sudo_ apt-get -q install -y --no-install-recommends "${missing[@]}" </dev/null >/dev/null ||
        die "apt-get install ${missing[*]} failed"
}

# build_c_plugin DIR: build CRIU's cuda_plugin.so for the copy of CRIU in DIR (its marker
# names the Debian version and suite) into DIR/c-plugin/.
build_c_plugin() {
    local dir=$1 ver debver suite dest work src orig patched t0 so
    ver=$(sed -n 's/^version=//p' "$dir/$marker_name")
    debver=$(sed -n 's/^debian_version=//p' "$dir/$marker_name")
    suite=$(sed -n 's/^suite=//p' "$dir/$marker_name")
    dest=$dir/c-plugin
    t0=$SECONDS
    rm -rf "$dest"
    work=$dest/src
    mkdir -p "$work"
    # apt-get source unpacks with dpkg-source; a mirror that lacks Debian's packaging files
    # makes it fail after the upstream tarball arrived (and was checked).
    patched=yes
    if ! (cd "$work" && apt-get "${PRIVATE_APT_OPTS[@]}" source "criu=$debver") >"$dest/source.log" 2>&1; then
        orig=$(find "$work" -maxdepth 1 -name "criu_$ver.orig.tar.*" | head -n1)
        [ -n "$orig" ] || {
            cat "$dest/source.log" >&2
            die "apt-get source criu=$debver ($suite) failed (log above, also in $dest/source.log)"
        }
        say "WARNING: C plugin $ver: the mirror has no Debian packaging for criu $debver (see $dest/source.log); building from the upstream tarball $(basename "$orig") alone, which apt checked against the signed Sources index, without Debian's patches"
        patched=no
        mkdir -p "$work/criu-$ver"
        tar -C "$work/criu-$ver" --strip-components=1 -xf "$orig" || die "unpacking $orig failed"
    fi
    src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'criu-*' | head -n1)
    [ -n "$src" ] && [ -f "$src/plugins/cuda/cuda_plugin.c" ] || die "criu $debver's source has no plugins/cuda/cuda_plugin.c"
    # The partial build: the generated headers the plugin includes, compel's host tool (the
    # plugin's Makefile asks it for compel's include path), then upstream's plugin Makefile.
    if ! make -C "$src" -j"$(nproc)" ARCH=x86 criu/include/version.h include/common/asm \
        include/common/config.h compel/compel-host-bin >"$dest/build.log" 2>&1 ||
        ! make -C "$src/plugins/cuda" ARCH=x86 >>"$dest/build.log" 2>&1; then
        tail -n 30 "$dest/build.log" >&2
        die "building criu $ver's plugins/cuda failed (log above, also in $dest/build.log)"
    fi
    so=$src/plugins/cuda/cuda_plugin.so
    readelf -h "$so" 2>/dev/null | grep -q 'Type: *DYN' || die "$so is not a shared object"
    readelf --dyn-syms -W "$so" | awk '$7 != "UND" {print $8}' | grep -qx CR_PLUGIN_DESC ||
        die "$so does not export CR_PLUGIN_DESC"
    cp "$so" "$dest/cuda_plugin.so"
    {
        echo "version=$ver"
        echo "debian_version=$debver"
        echo "suite=$suite"
        echo "debian_patches=$patched"
        echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "compiler=$(cc --version | head -n1)"
    } >"$dest/BUILD-INFO"
    say "C plugin $ver: built $dest/cuda_plugin.so in $((SECONDS - t0)) s (Debian patches: $patched)"
}

# c_plugin_built DIR: whether DIR/c-plugin holds the plugin of DIR's CRIU (and no rebuild
# was asked for).
c_plugin_built() {
    local dir=$1
    [ "$force" = 0 ] && [ -f "$dir/c-plugin/cuda_plugin.so" ] &&
        grep -qx "debian_version=$(sed -n 's/^debian_version=//p' "$dir/$marker_name")" "$dir/c-plugin/BUILD-INFO" 2>/dev/null
}

# build_c_plugins: build the C plugin of every fetched CRIU, then rewrite target/criu/c-plugins.
build_c_plugins() {
    local m dir suites="" lines=() s
    [ "$c_plugin" = 1 ] || return 0
    for m in "$out"/*/"$marker_name"; do
        [ -f "$m" ] || continue
        dir=$(dirname "$m")
        lines+=("$(sed -n 's/^version=//p' "$m") $dir/c-plugin/cuda_plugin.so")
        if c_plugin_built "$dir"; then
            say "C plugin $(basename "$dir"): already built at $dir/c-plugin/cuda_plugin.so (skipping; --force rebuilds)"
            continue
        fi
        s=$(sed -n 's/^suite=//p' "$m")
        case " $suites " in *" $s "*) ;; *) suites="$suites $s" ;; esac
    done
    [ "${#lines[@]}" -gt 0 ] || die "--c-plugin: no fetched CRIU in $out"
    if [ -z "$suites" ]; then
        printf '%s\n' "${lines[@]}" | sort -V >"$out/c-plugins"
        say "C plugins; $out/c-plugins:"
        sed 's/^/  /' "$out/c-plugins"
        return 0
    fi
    install_build_packages
    # shellcheck source=scripts/lib/private-apt.sh
    . "$repo/scripts/lib/private-apt.sh"
    [ -r "$keyring" ] || die "Debian archive keyring $keyring not found (apt-get install debian-archive-keyring)"
    local src_apt=$out/apt-src sources=()
    for s in $suites; do
        sources+=("deb-src [signed-by=$keyring] $mirror $s main")
    done
    private_apt_setup "$src_apt" amd64 "${sources[@]}"
    say "C plugin: updating the private source lists (${suites# }) under $src_apt"
    private_apt_update "$src_apt"
    for m in "$out"/*/"$marker_name"; do
        [ -f "$m" ] || continue
        dir=$(dirname "$m")
        c_plugin_built "$dir" || build_c_plugin "$dir"
    done
    printf '%s\n' "${lines[@]}" | sort -V >"$out/c-plugins.tmp"
    mv -f "$out/c-plugins.tmp" "$out/c-plugins"
    say "C plugins; $out/c-plugins:"
    sed 's/^/  /' "$out/c-plugins"
}

if [ "${#todo[@]}" = 0 ]; then
    write_versions
    if [ "$smoke" = 1 ]; then
        while read -r _ w; do smoke "$w"; done <"$out/versions"
    fi
    say "nothing to fetch; $out/versions:"
    sed 's/^/  /' "$out/versions"
    build_c_plugins
    exit 0
fi

# --------------------------------------------------------------- private apt

# shellcheck source=scripts/lib/private-apt.sh
. "$repo/scripts/lib/private-apt.sh"
[ -r "$keyring" ] || die "Debian archive keyring $keyring not found; install it with 'apt-get install debian-archive-keyring' (or set CRIU_CUDA_DEBIAN_KEYRING)"

apt_dir=$out/apt
sources=()
for s in $all_suites; do
    sources+=("deb [arch=amd64 signed-by=$keyring target=Packages] $mirror $s main")
done
private_apt_setup "$apt_dir" amd64 "${sources[@]}"
apt_opts=("${PRIVATE_APT_OPTS[@]}")

say "updating the private package lists ($all_suites from $mirror) under $apt_dir"
private_apt_update "$apt_dir"

# upstream_version DEBVERSION: "1:4.1.1-1" -> "4.1.1"
upstream_version() {
    local v=${1#*:}
    printf '%s' "${v%-*}"
}

# ------------------------------------------------------------------ per series

fetch_series() {
    local series=$1
    shift
    local suite="" s cand debver ver pkgs stage dest loader libpath m f

    for s in "$@"; do
        cand=$(apt-cache "${apt_opts[@]}" madison criu 2>/dev/null |
            awk -F'|' -v s="$s" '$3 ~ (" " s "/") {gsub(/ /, "", $2); print $2; exit}')
        if [ -n "$cand" ] && [[ "$(upstream_version "$cand")" == "$series".* || "$(upstream_version "$cand")" == "$series" ]]; then
            suite=$s
            debver=$cand
            break
        fi
        say "CRIU $series.x: suite $s has criu '${cand:-none}', not $series.x"
    done
    [ -n "$suite" ] || die "no Debian suite among '$*' ships criu $series.x any more; update series_list in scripts/fetch-criu.sh"
    ver=$(upstream_version "$debver")
    say "CRIU $series.x: using criu $debver from $suite"

    stage=$(mktemp -d "$out/.stage-$ver.XXXXXX")
    private_apt_unpack "$apt_dir" "$suite" "$stage" "criu=$debver"
    pkgs=$PRIVATE_APT_PACKAGES
    say "CRIU $ver: packages: $(printf '%s\n' "$pkgs" | tr '\n' ' ')"
    [ -x "$stage/usr/sbin/criu" ] || die "criu $debver has no usr/sbin/criu"

    # Since trixie glibc lives under usr/lib (merged /usr); older layouts used lib/.
    loader=""
    for f in usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 lib/x86_64-linux-gnu/ld-linux-x86-64.so.2; do
        if [ -f "$stage/$f" ] && [ ! -L "$stage/$f" ]; then
            loader=$f
            break
        fi
    done
    [ -n "$loader" ] || die "no dynamic loader (ld-linux-x86-64.so.2) in the libc6 package of $suite"
    # Expanded by the wrapper at run time, not here.
    # shellcheck disable=SC2016
    # LD_LIBRARY_PATH is appended: the loader's --library-path replaces it, and plugins
    # dlopen libraries (libcuda.so.1) that the caller points to with it.
    libpath='$here/usr/lib/x86_64-linux-gnu:$here/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}'

    cat >"$stage/criu" <<EOF
#!/bin/sh
# Generated by scripts/fetch-criu.sh: Debian criu $debver ($suite), run through its own
# glibc loader and the libraries unpacked next to this file, then \$LD_LIBRARY_PATH (for
# libraries plugins dlopen). Resolves its directory at run time, so the tree can be moved.
here=\$(dirname "\$(readlink -f "\$0")")
exec "\$here/$loader" --library-path "$libpath" "\$here/usr/sbin/criu" "\$@"
EOF
    chmod 755 "$stage/criu"

    {
        echo "series=$series"
        echo "version=$ver"
        echo "debian_version=$debver"
        echo "suite=$suite"
        echo "loader=$loader"
        echo "fetched=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        printf '%s\n' "$pkgs" | sed 's/^/package=/'
    } >"$stage/$marker_name"

    dest=$out/$ver
    rm -rf "$dest"
    mv "$stage" "$dest"
    # Drop older copies of the same series (e.g. 4.2.1 replacing 4.2.0).
    for m in "$out"/*/"$marker_name"; do
        [ -f "$m" ] || continue
        [ "$(dirname "$m")" = "$dest" ] && continue
        if grep -qx "series=$series" "$m"; then
            say "CRIU $series.x: removing older copy $(dirname "$m")"
            rm -rf "$(dirname "$m")"
        fi
    done

    local got
    got=$(wrapper_version "$dest/criu")
    if [ "$got" != "$ver" ]; then
        "$dest/criu" --version >&2 || true
        rm -f "$dest/$marker_name"
        die "$dest/criu --version did not report $ver (got '${got:-nothing}'; output above)"
    fi
    say "CRIU $ver: installed at $dest/criu ('criu --version' says $got)"

    if [ "$(id -u)" = 0 ]; then
        local check
        if check=$("$dest/criu" check 2>&1); then
            say "CRIU $ver: 'criu check': $(printf '%s' "$check" | tail -n1)"
        else
            printf '%s\n' "$check" | sed 's/^/  /' >&2
            say "WARNING: CRIU $ver: '$dest/criu check' failed (output above); the kernel or sandbox may not support CRIU"
        fi
    else
        say "CRIU $ver: not root, skipping 'criu check'"
    fi
}

for entry in "${todo[@]}"; do
    # shellcheck disable=SC2086 # "<series> <suite>..."
    fetch_series $entry
done

write_versions
if [ "$smoke" = 1 ]; then
    while read -r _ w; do smoke "$w"; done <"$out/versions"
fi
say "done; $out/versions:"
sed 's/^/  /' "$out/versions"
build_c_plugins
