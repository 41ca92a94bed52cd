#!/usr/bin/env bash
# Install the CUDA compiler toolchain for zdtm-cuda from NVIDIA's Python wheels (no GPU, no
# driver, no system CUDA needed) into target/cuda-toolchain/, then print the nvcc path on the
# last line of stdout.
#
# Wheels (CUDA 13; the cu12 nvcc wheels ship only ptxas, not nvcc):
#   nvidia-cuda-nvcc     nvcc, cudafe++, fatbinary, nvlink, ptxas        (~47 MB download)
#   nvidia-nvvm          cicc, libnvvm, libdevice                       (~75 MB)
#   nvidia-cuda-crt      crt/ headers nvcc includes                     (~0.2 MB)
#   nvidia-cuda-runtime  cuda_runtime.h, libcudart_static.a             (~2.5 MB)
# about 125 MB downloaded, 320 MB installed. cuBLAS is not needed to build (the workload loads
# it with dlopen); --with-cublas also installs nvidia-cublas (~445 MB download, 610 MB installed)
# for running cuda_cublas00 on a GPU machine without a system cuBLAS.
#
# Running it again is a fast no-op when the same versions are installed.
# Options:
#   --with-cublas  also install nvidia-cublas
#   --force        reinstall
#   -h|--help      print this help
# Environment:
#   ZDTM_CUDA_TOOLCHAIN   install directory (default: <repo>/target/cuda-toolchain)
#   ZDTM_CUDA_WHEELS      pip requirement specifiers to use instead of the package names,
#                         e.g. "nvidia-cuda-nvcc==13.0.* nvidia-nvvm==13.0.* ..."
#   PYTHON                the Python with pip (default: python3)
set -euo pipefail

die() {
    printf 'zdtm-cuda-toolchain: error: %s\n' "$*" >&2
    exit 1
}
say() { printf 'zdtm-cuda-toolchain: %s\n' "$*" >&2; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

with_cublas=0
force=0
for arg in "$@"; do
    case "$arg" in
    --with-cublas) with_cublas=1 ;;
    --force) force=1 ;;
    -h | --help)
        usage
        exit 0
        ;;
    *) die "unknown argument '$arg' (try --help)" ;;
    esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
dest=${ZDTM_CUDA_TOOLCHAIN:-$repo/target/cuda-toolchain}
python=${PYTHON:-python3}
command -v "$python" >/dev/null 2>&1 || die "$python not found (set PYTHON)"
"$python" -m pip --version >/dev/null 2>&1 || die "$python has no pip"

read -r -a pkgs <<<"${ZDTM_CUDA_WHEELS:-nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-crt nvidia-cuda-runtime}"
if [ "$with_cublas" = 1 ] && ! printf '%s\n' "${pkgs[@]}" | grep -q '^nvidia-cublas'; then
    pkgs+=(nvidia-cublas)
fi

mkdir -p "$dest"
dest=$(cd "$dest" && pwd -P)
if command -v flock >/dev/null 2>&1; then
    exec 9>"$dest/.lock"
    flock 9
fi

find_nvcc() { ls -1d "$dest"/nvidia/cu*/bin/nvcc 2>/dev/null | sort -V | tail -n1; }

# Installed when every requested package has a dist-info and nvcc runs.
installed() {
    local p name
    for p in "${pkgs[@]}"; do
        name=${p%%[=<>~! ]*}
        name=${name//-/_}
        compgen -G "$dest/${name}-*.dist-info" >/dev/null || return 1
    done
    local n
    n=$(find_nvcc)
    [ -n "$n" ] && "$n" --version >/dev/null 2>&1
}

if [ "$force" = 0 ] && installed; then
    say "already installed in $dest: $(cd "$dest" && ls -d nvidia_*.dist-info | sed 's/\.dist-info$//' | tr '\n' ' ')(--force reinstalls)"
else
    say "installing ${pkgs[*]} into $dest (pip install --target, --no-deps)"
    start=$(date +%s)
    # --no-deps: nvidia-cublas pulls nvidia-cuda-nvrtc, which nothing here needs.
    # --upgrade: replace older copies inside --target.
    "$python" -m pip install --disable-pip-version-check --root-user-action=ignore --no-input -q --no-deps --upgrade \
        --only-binary=:all: --target "$dest" "${pkgs[@]}" >&2 ||
        die "pip install failed"
    say "installed in $(($(date +%s) - start)) s; $(du -sh "$dest" | cut -f1) on disk"
fi

nvcc=$(find_nvcc)
[ -n "$nvcc" ] || die "no nvidia/cu*/bin/nvcc under $dest after the install"
"$nvcc" --version | tail -n2 | sed 's/^/zdtm-cuda-toolchain:   /' >&2
printf '%s\n' "$nvcc"
