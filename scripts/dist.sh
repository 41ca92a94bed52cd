#!/usr/bin/env bash
# Release artifacts: cuda_plugin.so for x86_64 and aarch64 Linux, built for glibc 2.17 and
# newer, with its debug info split off, in one versioned tarball per architecture:
#
#   target/dist/criu-cuda-plugin-<version>-<arch>-linux-gnu.tar.gz, holding
#     criu-cuda-plugin-<version>-<arch>-linux-gnu/
#       cuda_plugin.so        stripped; names its debug file (.gnu_debuglink) and has a build-id
#       cuda_plugin.so.debug  the debug info (objcopy --only-keep-debug, zlib-compressed)
#       cuda-plugin-doctor    the node doctor (docs/doctor.md), stripped, same glibc floor
#       INSTALL               where the files go, how to check that CRIU loaded the plugin
#       LICENSE               Apache-2.0
#       SHA256SUMS            of the five files above
#   target/dist/SHA256SUMS    of this version's tarballs in target/dist
# (target/dist/ is also where cargo puts the dist profile's host artifacts, build scripts and
# proc-macros, in build/ and deps/: the tarballs sit beside them.)
#
# <version> is the crate version (Cargo.toml), which the plugin also reports; a release is the
# git tag v<version> (.github/workflows/release.yml runs this script on such a tag).
#
# How:
#   1. Tools (scripts/lib/dist-tools.sh): pinned Zig and cargo-zigbuild from PyPI in a venv
#      under target/dist-tools, and the Rust standard library of each target (`rustup target
#      add`; needs rustup's download server).
#   2. `cargo zigbuild --locked --profile dist -p cuda-plugin -p cuda-plugin-doctor --lib --bin
#      cuda-plugin-doctor --target <arch>-unknown-linux-gnu.2.17` (one run for every
#      architecture, built side by side):
#      Cargo.toml's `dist` profile (release with fat LTO, one
#      codegen unit, full debug info, panic=unwind) linked by Zig against glibc 2.17's symbol
#      versions, with a GNU build-id, and the Rust code's paths remapped (/criu-cuda, /cargo).
#      Why 2.17: it is the oldest glibc the Rust standard library supports on Linux, and the
#      first glibc release for aarch64; the plugin itself needs nothing newer.
#   3. objcopy (binutils; binutils-aarch64-linux-gnu's aarch64-linux-gnu-objcopy for aarch64)
#      splits the debug info off and strips the .so, and strips the doctor.
#   4. tar with sorted names, owner root and every mtime at SOURCE_DATE_EPOCH, gzip -n: the same
#      commit, tools and checkout directory give the same bytes. (Another directory gives the
#      same code but another build-id: the debug info of the unwinder Zig builds in records
#      the directory the build ran in.)
#   5. scripts/check-dist.sh checks each tarball (glibc floor, size, architecture, symbols).
#
# Usage: scripts/dist.sh [--arch x86_64|aarch64]... [--print-version] [-h|--help]
#   --arch ARCH       build only ARCH (repeatable; default: x86_64 and aarch64)
#   --print-version   print the version the tarballs get and exit
# Environment:
#   CARGO_TARGET_DIR   as for cargo (default: <repo>/target); the tarballs go to its dist/
#   SOURCE_DATE_EPOCH  time stamp of the tarballs' files (default: the commit time of HEAD)
#   RUSTFLAGS          extra flags, added before the script's own
set -euo pipefail

die() {
    printf 'dist: error: %s\n' "$*" >&2
    exit 1
}
say() { printf 'dist: %s\n' "$*"; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$repo"

arches=()
print_version=0
while [ $# -gt 0 ]; do
    case "$1" in
    --arch)
        [ $# -ge 2 ] || die "--arch needs a value (x86_64 or aarch64)"
        case "$2" in
        x86_64 | aarch64) arches+=("$2") ;;
        *) die "unknown architecture '$2' (x86_64 or aarch64)" ;;
        esac
        shift 2
        ;;
    --print-version)
        print_version=1
        shift
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    *) die "unknown argument '$1' (try --help)" ;;
    esac
done
[ "${#arches[@]}" -gt 0 ] || arches=(x86_64 aarch64)

command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust with rustup)"
pkgid=$(cargo pkgid -p cuda-plugin) || die "cargo pkgid -p cuda-plugin failed: cannot read the plugin's version"
version=${pkgid##*[#@]}
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]+)?$ ]] ||
    die "cannot read the plugin's version from '$pkgid'"
if [ "$print_version" = 1 ]; then
    printf '%s\n' "$version"
    exit 0
fi

target_dir=${CARGO_TARGET_DIR:-$repo/target}
case "$target_dir" in
/*) ;;
*) target_dir=$repo/$target_dir ;;
esac
out=$target_dir/dist
floor=2.17

# ------------------------------------------------------------------------------ tools

# shellcheck source=scripts/lib/dist-tools.sh
. "$repo/scripts/lib/dist-tools.sh"
dist_tools_setup "$target_dir"

for t in tar gzip sha256sum readelf; do
    command -v "$t" >/dev/null 2>&1 || die "$t not found (Debian: tar, gzip, coreutils, binutils)"
done

# objcopy_for ARCH: the objcopy that handles ARCH's ELF files.
objcopy_for() {
    local tool pkg
    case "$1" in
    x86_64) tool=objcopy pkg=binutils ;;
    aarch64) tool=aarch64-linux-gnu-objcopy pkg=binutils-aarch64-linux-gnu ;;
    esac
    if [ "$1" = x86_64 ] && [ "$(uname -m)" != x86_64 ]; then
        tool=x86_64-linux-gnu-objcopy pkg=binutils-x86-64-linux-gnu
    fi
    if [ "$1" = aarch64 ] && [ "$(uname -m)" = aarch64 ]; then
        tool=objcopy pkg=binutils
    fi
    command -v "$tool" >/dev/null 2>&1 ||
        die "$tool not found: it splits the debug info of the $1 plugin off (Debian: apt-get install $pkg)"
    printf '%s' "$tool"
}

sysroot=$(rustc --print sysroot) || die "rustc --print sysroot failed"
for arch in "${arches[@]}"; do
    triple=$arch-unknown-linux-gnu
    objcopy_for "$arch" >/dev/null
    if [ ! -d "$sysroot/lib/rustlib/$triple/lib" ]; then
        command -v rustup >/dev/null 2>&1 ||
            die "no Rust standard library for $triple in $sysroot, and no rustup to add it"
        say "adding the Rust standard library for $triple (rustup target add)"
        rustup target add "$triple" ||
            die "'rustup target add $triple' failed: the $arch plugin needs the standard library of that target"
    fi
done

# ----------------------------------------------------------------------------- build

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git -C "$repo" log -1 --format=%ct 2>/dev/null) || SOURCE_DATE_EPOCH=""
    [ -n "$SOURCE_DATE_EPOCH" ] || SOURCE_DATE_EPOCH=$(date +%s)
fi
export SOURCE_DATE_EPOCH

cargo_home=${CARGO_HOME:-$HOME/.cargo}
rustflags="${RUSTFLAGS:-} -C link-arg=-Wl,--build-id=sha1"
rustflags+=" --remap-path-prefix=$repo=/criu-cuda --remap-path-prefix=$cargo_home=/cargo"

mkdir -p "$out"
# Every architecture in one cargo run: the fat-LTO links are mostly single-threaded, so the
# architectures build side by side.
targets=()
for arch in "${arches[@]}"; do
    targets+=(--target "$arch-unknown-linux-gnu.$floor")
done
say "building: cargo zigbuild --profile dist ${targets[*]}"
RUSTFLAGS=$rustflags cargo zigbuild --locked --profile dist -p cuda-plugin -p cuda-plugin-doctor \
    --lib --bin cuda-plugin-doctor "${targets[@]}" ||
    die "cargo zigbuild ${targets[*]} failed"
tarballs=()
for arch in "${arches[@]}"; do
    triple=$arch-unknown-linux-gnu
    name=criu-cuda-plugin-$version-$arch-linux-gnu
    so=$target_dir/$triple/dist/libcuda_plugin.so
    [ -f "$so" ] || die "the build did not produce $so"
    doctor=$target_dir/$triple/dist/cuda-plugin-doctor
    [ -f "$doctor" ] || die "the build did not produce $doctor"

    stage=$(mktemp -d "$out/.stage-$arch.XXXXXX")
    d=$stage/$name
    mkdir -p "$d"
    objcopy=$(objcopy_for "$arch")
    "$objcopy" --only-keep-debug --compress-debug-sections=zlib "$so" "$d/cuda_plugin.so.debug" ||
        die "$objcopy --only-keep-debug $so failed"
    (cd "$d" && "$objcopy" --strip-all --add-gnu-debuglink=cuda_plugin.so.debug "$so" cuda_plugin.so) ||
        die "$objcopy --strip-all --add-gnu-debuglink $so failed"
    "$objcopy" --strip-all "$doctor" "$d/cuda-plugin-doctor" ||
        die "$objcopy --strip-all $doctor failed"
    sed -e "s/@VERSION@/$version/g" -e "s/@ARCH@/$arch/g" packaging/INSTALL.in >"$d/INSTALL"
    cp LICENSE "$d/LICENSE"
    (cd "$d" && sha256sum cuda_plugin.so cuda_plugin.so.debug cuda-plugin-doctor INSTALL LICENSE \
        >SHA256SUMS)
    chmod 0755 "$d"
    chmod 0644 "$d"/*
    chmod 0755 "$d/cuda-plugin-doctor"
    tarball=$out/$name.tar.gz
    tar --sort=name --format=gnu --owner=0 --group=0 --numeric-owner \
        --mtime="@$SOURCE_DATE_EPOCH" -C "$stage" -cf - "$name" | gzip -9 -n >"$tarball.tmp" ||
        die "packing $tarball failed"
    mv -f "$tarball.tmp" "$tarball"
    rm -rf "$stage"
    tarballs+=("$tarball")
    say "wrote $tarball ($(stat -c %s "$tarball") bytes)"
done

(cd "$out" && sha256sum "criu-cuda-plugin-$version-"*-linux-gnu.tar.gz) >"$out/SHA256SUMS.tmp" ||
    die "sha256sum of the tarballs in $out failed"
mv -f "$out/SHA256SUMS.tmp" "$out/SHA256SUMS"

bash "$repo/scripts/check-dist.sh" "${tarballs[@]}"
say "done: ${tarballs[*]} (checksums in $out/SHA256SUMS)"
