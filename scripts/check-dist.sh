#!/usr/bin/env bash
# Checks release tarballs of scripts/dist.sh without running anything from them (readelf from
# binutils reads ELF files of any architecture). For each
# criu-cuda-plugin-<version>-<arch>-linux-gnu.tar.gz:
#
#   - it holds exactly <name>/{cuda_plugin.so,cuda_plugin.so.debug,cuda-plugin-doctor,INSTALL,
#     LICENSE,SHA256SUMS}, and SHA256SUMS matches the files;
#   - cuda-plugin-doctor is an executable 64-bit ELF program for <arch>, stripped, with the
#     plugin's glibc floor and library rules below;
#   - cuda_plugin.so is a 64-bit little-endian ELF shared object for <arch>;
#   - glibc floor: the highest GLIBC_x.y version it needs is at most GLIBC_2.17, and every
#     symbol it needs that is not weak has a version (an unversioned one binds to whatever the
#     host has, or fails the load: the plugin is linked with -z now);
#   - size: cuda_plugin.so is under 1,500,000 bytes (what a user feels is correctness, not
#     100 KB: the plugin never replaces a well-kept crate with hand-written code to save bytes);
#   - it exports (defines) CR_PLUGIN_DESC and CR_PLUGIN_OPTIONS_META, which CRIU and tools read;
#   - it needs only glibc's libraries (no libcuda: the driver is dlopen()ed at run time);
#   - it is stripped (no .symtab, no .debug_* sections), its .gnu_debuglink names
#     cuda_plugin.so.debug, and its build-id is the debug file's, which has .debug_info.
#
# Prints one line per tarball with the numbers, and every failed check with the number and the
# limit; exits 1 when a check failed, 2 on bad usage.
#
# Usage: scripts/check-dist.sh TARBALL...
set -euo pipefail

# The limits. Raise one only with a reason in the commit message.
glibc_floor=2.17
max_so_bytes=1500000
# The libraries the plugin may need: glibc's (x86_64 also names its loader, for
# __tls_get_addr). libgcc_s is not among them: Zig links the unwinder statically.
allowed_needed="libc.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libm.so.6 ld-linux-x86-64.so.2 ld-linux-aarch64.so.1"
required_exports="CR_PLUGIN_DESC CR_PLUGIN_OPTIONS_META"

say() { printf 'check-dist: %s\n' "$*"; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

case "${1:-}" in
-h | --help)
    usage
    exit 0
    ;;
"")
    usage >&2
    exit 2
    ;;
esac
for t in tar readelf sha256sum; do
    command -v "$t" >/dev/null 2>&1 || {
        say "error: $t not found (Debian: tar, binutils, coreutils)" >&2
        exit 1
    }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/check-dist.XXXXXX")
trap 'rm -rf "$work"' EXIT

failures=0
fail() {
    say "FAIL: $name: $*" >&2
    failures=$((failures + 1))
}

# version_le A B: A <= B for dotted versions.
version_le() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$1" ]; }

# glibc_floor_of NAME FILE: checks that FILE needs no GLIBC_ version above the floor and no
# unversioned symbol that is not weak; sets `highest` to the highest version it needs. (Not
# run in a command substitution: `fail` counts in this shell.)
glibc_floor_of() {
    local what=$1 f=$2 glibc above unversioned
    glibc=$(readelf -V -W "$f" | grep -o 'Name: GLIBC_[0-9][0-9.]*' | sed 's/^Name: GLIBC_//' | sort -uV)
    highest=$(tail -n1 <<<"$glibc")
    if [ -z "$highest" ]; then
        fail "$what needs no GLIBC_ symbol version at all (readelf -V found none): not a glibc build?"
    elif ! version_le "$highest" "$glibc_floor"; then
        above=$(readelf --dyn-syms -W "$f" | awk '$7 == "UND" {print $8}' | grep -F '@GLIBC_' |
            while read -r s; do
                v=${s#*@GLIBC_}
                v=${v%% *}
                version_le "$v" "$glibc_floor" || printf '%s ' "$s"
            done)
        fail "$what needs GLIBC_$highest, above the floor GLIBC_$glibc_floor (symbols: ${above:-see readelf -V})"
    fi
    # Undefined, not weak, and without a version: bound to whatever the host has, if anything.
    unversioned=$(readelf --dyn-syms -W "$f" | awk '$7 == "UND" && $5 != "WEAK" && $8 != "" && $8 !~ /@/ {print $8}' | tr '\n' ' ')
    [ -z "$unversioned" ] ||
        fail "$what needs symbols without a version, which glibc $glibc_floor may lack: $unversioned(use the raw system call, or a weak reference with a fallback)"
}

# needed_ok NAME FILE: FILE needs only glibc's libraries, and never libcuda; sets `needed`.
needed_ok() {
    local what=$1 f=$2 lib
    needed=$(readelf -d -W "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p')
    for lib in $needed; do
        case "$lib" in
        libcuda*) fail "$what links $lib: the driver must be dlopen()ed, not needed" ;;
        *) [[ " $allowed_needed " == *" $lib "* ]] || fail "$what needs $lib, not one of: $allowed_needed" ;;
        esac
    done
}

# stripped NAME FILE: FILE has no .symtab and no .debug_* section. .debug_gdb_scripts is
# not debug information: rustc puts it in a Rust program's loaded image (a few bytes that
# ask gdb for Rust's pretty-printers), so strip keeps it and so does this check.
stripped() {
    local sections stray
    sections=$(readelf -S -W "$2" | sed -n 's/^ *\[ *[0-9]*\] \([^ ]*\) .*/\1/p')
    stray=$(grep -E '^(\.symtab|\.debug_)' <<<"$sections" | grep -vx '\.debug_gdb_scripts' |
        tr '\n' ' ' || true)
    [ -z "$stray" ] || fail "$1 is not stripped: it has $stray"
}

for tarball in "$@"; do
    base=$(basename "$tarball")
    name=${base%.tar.gz}
    if [[ ! "$base" =~ ^criu-cuda-plugin-([0-9][0-9A-Za-z.+-]*)-(x86_64|aarch64)-linux-gnu\.tar\.gz$ ]]; then
        fail "not a release tarball name (criu-cuda-plugin-<version>-<x86_64|aarch64>-linux-gnu.tar.gz)"
        continue
    fi
    arch=${BASH_REMATCH[2]}
    [ -f "$tarball" ] || {
        fail "$tarball does not exist"
        continue
    }

    # --- contents
    listing=$(tar -tzf "$tarball" | sort) || {
        fail "tar cannot list $tarball"
        continue
    }
    expected=$(printf '%s\n' "$name/" "$name/INSTALL" "$name/LICENSE" "$name/SHA256SUMS" \
        "$name/cuda_plugin.so" "$name/cuda_plugin.so.debug" "$name/cuda-plugin-doctor" | sort)
    if [ "$listing" != "$expected" ]; then
        fail "contents differ from the expected six files in $name/: $(diff <(printf '%s\n' "$expected") <(printf '%s\n' "$listing") | grep '^[<>]' | tr '\n' ' ')"
        continue
    fi
    mkdir -p "$work/$name"
    tar -xzf "$tarball" -C "$work/$name"
    d=$work/$name/$name
    so=$d/cuda_plugin.so
    if ! (cd "$d" && sha256sum --quiet -c SHA256SUMS) >"$work/$name.sha" 2>&1; then
        fail "SHA256SUMS does not match: $(tr '\n' ' ' <"$work/$name.sha")"
    fi

    # --- ELF header
    header=$(readelf -h "$so")
    field() { sed -n "s/^ *$1: *//p" <<<"$header"; }
    case "$arch" in
    x86_64) machine="Advanced Micro Devices X86-64" ;;
    aarch64) machine="AArch64" ;;
    esac
    [ "$(field Class)" = ELF64 ] || fail "cuda_plugin.so is $(field Class), not ELF64"
    [[ "$(field Data)" == *"little endian"* ]] || fail "cuda_plugin.so is $(field Data), not little endian"
    [[ "$(field Type)" == DYN* ]] || fail "cuda_plugin.so is $(field Type), not a shared object (DYN)"
    [ "$(field Machine)" = "$machine" ] || fail "cuda_plugin.so is for '$(field Machine)', not $arch ('$machine')"

    # --- glibc floor
    glibc_floor_of cuda_plugin.so "$so"

    # --- size
    size=$(stat -c %s "$so")
    [ "$size" -lt "$max_so_bytes" ] ||
        fail "cuda_plugin.so is $size bytes, not under the limit of $max_so_bytes bytes"

    # --- exports
    defined=$(readelf --dyn-syms -W "$so" | awk '$7 != "UND" && $5 == "GLOBAL" {sub(/@.*/, "", $8); print $8}')
    for s in $required_exports; do
        grep -qx "$s" <<<"$defined" || fail "cuda_plugin.so does not export $s"
    done

    # --- needed libraries
    needed_ok cuda_plugin.so "$so"

    # --- stripped, with its debug file
    stripped cuda_plugin.so "$so"
    link=$(readelf -p .gnu_debuglink -W "$so" 2>/dev/null | sed -n 's/^ *\[ *0\] *//p')
    [ "$link" = cuda_plugin.so.debug ] ||
        fail "cuda_plugin.so's .gnu_debuglink names '${link:-nothing}', not cuda_plugin.so.debug"
    build_id() { readelf -n "$1" | sed -n 's/^ *Build ID: *//p'; }
    id_so=$(build_id "$so")
    id_debug=$(build_id "$d/cuda_plugin.so.debug")
    [ -n "$id_so" ] || fail "cuda_plugin.so has no GNU build-id"
    [ "$id_so" = "$id_debug" ] ||
        fail "the build-ids differ: cuda_plugin.so ${id_so:-none}, cuda_plugin.so.debug ${id_debug:-none}"
    readelf -S -W "$d/cuda_plugin.so.debug" | grep -q ' \.debug_info ' ||
        fail "cuda_plugin.so.debug has no .debug_info"

    # --- the doctor
    doctor=$d/cuda-plugin-doctor
    dheader=$(readelf -h "$doctor")
    dfield() { sed -n "s/^ *$1: *//p" <<<"$dheader"; }
    [ "$(dfield Class)" = ELF64 ] || fail "cuda-plugin-doctor is $(dfield Class), not ELF64"
    [ "$(dfield Machine)" = "$machine" ] || fail "cuda-plugin-doctor is for '$(dfield Machine)', not $arch ('$machine')"
    readelf -l -W "$doctor" | grep -q ' INTERP ' || fail "cuda-plugin-doctor is not a program (no INTERP segment)"
    [ -x "$doctor" ] || fail "cuda-plugin-doctor is not executable"
    so_highest=$highest so_needed=$needed
    glibc_floor_of cuda-plugin-doctor "$doctor"
    dhighest=$highest
    needed_ok cuda-plugin-doctor "$doctor"
    stripped cuda-plugin-doctor "$doctor"
    highest=$so_highest needed=$so_needed

    say "$name: cuda_plugin.so $size bytes (limit $max_so_bytes), highest symbol version GLIBC_$highest (floor GLIBC_$glibc_floor), needs $(printf '%s' "$needed" | paste -sd, -); cuda-plugin-doctor $(stat -c %s "$doctor") bytes, GLIBC_$dhighest; tarball $(stat -c %s "$tarball") bytes"
done

if [ "$failures" -gt 0 ]; then
    say "$failures check(s) failed" >&2
    exit 1
fi
say "all checks passed ($# tarball(s))"
