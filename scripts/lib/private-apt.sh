# Sourced (not run) by scripts that fetch Debian packages without changing the system:
# scripts/fetch-criu.sh (CRIU 4.x and its libraries) and scripts/check-dist-load.sh (an old
# glibc to load the release plugin against).
#
# A private apt configuration lives in one directory: its own sources list, package lists,
# cache and an empty dpkg status. /etc/apt/sources.list* and /var/lib/{apt,dpkg} are never read
# or written. apt checks every Release signature against the keyring named in the sources lines
# and every .deb against the hashes of the signed lists.
#
# The caller defines die() and say(). Functions:
#
#   private_apt_setup DIR ARCH LINE...
#       (Re)creates the configuration under DIR for Debian architecture ARCH (amd64, arm64)
#       with the sources list LINEs ("deb [...] MIRROR SUITE main"), and sets the array
#       PRIVATE_APT_OPTS: the options every apt-get/apt-cache call of this configuration needs.
#   private_apt_update DIR
#       `apt-get update` with that configuration; dies when it fails or reports a problem.
#   private_apt_unpack DIR SUITE DEST PACKAGE[=VERSION]...
#       Resolves the PACKAGEs and their whole run-time dependency closure in SUITE (a simulated
#       install against the empty dpkg status, so the result does not depend on the host),
#       downloads them with `apt-get download` into DIR/debs/SUITE and unpacks each with
#       `dpkg-deb -x` into DEST (nothing is installed). Sets PRIVATE_APT_PACKAGES to the
#       resolved "name=version" list, one a line.

private_apt_setup() {
    local dir=$1 arch=$2
    shift 2
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found: this script needs a Debian-like host"
    command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb not found: this script needs a Debian-like host"
    mkdir -p "$dir/etc/sources.list.d" "$dir/etc/preferences.d" \
        "$dir/state/lists/partial" "$dir/cache/archives/partial" "$dir/debs"
    : >"$dir/state/status"
    {
        echo "# Written by ${0##*/}; used only through its private apt options."
        printf '%s\n' "$@"
    } >"$dir/etc/sources.list"
    PRIVATE_APT_OPTS=(
        -o "Dir::Etc::SourceList=$dir/etc/sources.list"
        -o "Dir::Etc::SourceParts=$dir/etc/sources.list.d"
        -o "Dir::Etc::Preferences=$dir/etc/preferences"
        -o "Dir::Etc::PreferencesParts=$dir/etc/preferences.d"
        -o "Dir::State=$dir/state"
        -o "Dir::State::status=$dir/state/status"
        -o "Dir::Cache=$dir/cache"
        -o "APT::Architecture=$arch"
        -o "APT::Architectures=$arch"
        -o "Acquire::Languages=none"
        -o "Acquire::Retries=3"
        -q
    )
    if [ "$(id -u)" = 0 ]; then
        # The files land in directories that the _apt user cannot write.
        PRIVATE_APT_OPTS+=(-o "APT::Sandbox::User=root")
    fi
    export DEBIAN_FRONTEND=noninteractive
}

private_apt_update() {
    local dir=$1
    if ! apt-get "${PRIVATE_APT_OPTS[@]}" update >"$dir/update.log" 2>&1; then
        cat "$dir/update.log" >&2
        die "apt-get update with the private configuration failed (log above, also in $dir/update.log)"
    fi
    if grep -E '^(W|E): ' "$dir/update.log" >&2; then
        die "apt-get update reported problems (see above, also in $dir/update.log); refusing to continue with possibly stale or unverified lists"
    fi
}

private_apt_unpack() {
    local dir=$1 suite=$2 dest=$3
    shift 3
    local sim debs f
    # The dependency closure in that suite, from a simulated install against the empty dpkg
    # status (so every library comes from that suite, whatever the host has installed).
    if ! sim=$(apt-get "${PRIVATE_APT_OPTS[@]}" -s -t "$suite" --no-install-recommends install "$@" 2>&1); then
        printf '%s\n' "$sim" >&2
        die "could not resolve $* and its dependencies in $suite"
    fi
    PRIVATE_APT_PACKAGES=$(printf '%s\n' "$sim" | awk '/^Inst /{v=$3; gsub(/[()]/, "", v); print $2 "=" v}')
    [ -n "$PRIVATE_APT_PACKAGES" ] || {
        printf '%s\n' "$sim" >&2
        die "apt resolved no packages for $* in $suite"
    }
    debs=$dir/debs/$suite
    rm -rf "$debs"
    mkdir -p "$debs" "$dest"
    # shellcheck disable=SC2086 # one word per package
    if ! (cd "$debs" && apt-get "${PRIVATE_APT_OPTS[@]}" download $PRIVATE_APT_PACKAGES) >"$debs.log" 2>&1; then
        cat "$debs.log" >&2
        die "apt-get download failed for $* ($suite; log above, also in $debs.log)"
    fi
    [ "$(find "$debs" -name '*.deb' | wc -l)" = "$(printf '%s\n' "$PRIVATE_APT_PACKAGES" | wc -l)" ] ||
        die "apt-get download did not produce one .deb per package in $debs"
    for f in "$debs"/*.deb; do
        dpkg-deb -x "$f" "$dest" || die "dpkg-deb -x $f failed"
    done
}
