# Sourced (not run) by scripts/dist.sh and scripts/check-dist-load.sh: the pinned tools that
# build the release plugin for an old glibc, installed on first use under the target directory.
#
#   Zig (PyPI `ziglang`): the C toolchain and linker, with stubs of every glibc version's
#     symbols, so what links against "glibc 2.17" can only use what glibc 2.17 had.
#   cargo-zigbuild (PyPI `cargo-zigbuild`, the crates.io tool's own wheel): runs cargo with Zig
#     as the linker for targets such as `x86_64-unknown-linux-gnu.2.17`.
#
# Both go into a Python virtual environment, <target>/dist-tools/venv (nothing is installed
# system-wide); Zig's and cargo-zigbuild's caches stay under <target>/dist-tools too. To move
# to newer versions, change the pins below and run scripts/dist.sh: it reinstalls.
#
# The caller defines die() and say(). Functions:
#
#   dist_tools_setup TARGET_DIR
#       Makes sure the venv has exactly the pinned versions (pip install otherwise), puts its
#       bin/ first in PATH, and exports the cache locations.
#   dist_zig ARGS...
#       Runs the pinned Zig (e.g. `dist_zig cc -target x86_64-linux-gnu.2.17 ...`).

DIST_ZIGLANG_VERSION=0.15.2
DIST_CARGO_ZIGBUILD_VERSION=0.24.1

dist_tools_setup() {
    local tools=$1/dist-tools
    DIST_TOOLS_VENV=$tools/venv
    local py=$DIST_TOOLS_VENV/bin/python3 have_zig have_zb
    have_zig=$("$py" -m ziglang version 2>/dev/null) || have_zig=""
    have_zb=$("$DIST_TOOLS_VENV/bin/cargo-zigbuild" --version 2>/dev/null) || have_zb=""
    if [ "$have_zig" != "$DIST_ZIGLANG_VERSION" ] ||
        [ "$have_zb" != "cargo-zigbuild $DIST_CARGO_ZIGBUILD_VERSION" ]; then
        command -v python3 >/dev/null 2>&1 || die "python3 not found: it installs Zig and cargo-zigbuild from PyPI"
        say "installing ziglang==$DIST_ZIGLANG_VERSION and cargo-zigbuild==$DIST_CARGO_ZIGBUILD_VERSION from PyPI into $DIST_TOOLS_VENV"
        rm -rf "$DIST_TOOLS_VENV"
        mkdir -p "$tools"
        python3 -m venv "$DIST_TOOLS_VENV" ||
            die "python3 -m venv $DIST_TOOLS_VENV failed (on Debian: apt-get install python3-venv)"
        "$DIST_TOOLS_VENV/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check \
            "ziglang==$DIST_ZIGLANG_VERSION" "cargo-zigbuild==$DIST_CARGO_ZIGBUILD_VERSION" ||
            die "pip install of ziglang==$DIST_ZIGLANG_VERSION and cargo-zigbuild==$DIST_CARGO_ZIGBUILD_VERSION failed"
        have_zig=$("$py" -m ziglang version 2>/dev/null) || have_zig=""
        [ "$have_zig" = "$DIST_ZIGLANG_VERSION" ] ||
            die "the installed Zig reports '${have_zig:-nothing}', not $DIST_ZIGLANG_VERSION"
        "$DIST_TOOLS_VENV/bin/cargo-zigbuild" --version >/dev/null ||
            die "the installed cargo-zigbuild does not run"
    fi
    export PATH=$DIST_TOOLS_VENV/bin:$PATH
    export ZIG_GLOBAL_CACHE_DIR=$tools/zig-cache
    export ZIG_LOCAL_CACHE_DIR=$tools/zig-cache
    export CARGO_ZIGBUILD_CACHE_DIR=$tools/cargo-zigbuild-cache
}

dist_zig() {
    "$DIST_TOOLS_VENV/bin/python3" -m ziglang "$@"
}
