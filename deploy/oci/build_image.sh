#!/usr/bin/env bash
# Builds the mptrain OCI image offline (README.md, "An OCI image"): a Debian 12 root made with
# debootstrap (--variant=minbase) from the Debian mirror of this machine's apt sources, holding
# the Debian packages that supply the binaries' shared libraries (found with ldd and dpkg -S),
# then `podman build` of deploy/oci/Containerfile (FROM scratch, no RUN) with the binaries at
# /usr/local/bin. Libraries that no Debian package supplies (CUDA's, under the worker's
# RUNPATH /usr/local/cuda/lib64) are copied in at their own paths. Needs root (debootstrap,
# chroot), debootstrap and podman; no image registry.
#
# Usage: deploy/oci/build_image.sh [--bin_dir DIR] [--tag NAME] [--cache_dir DIR]
#                                  [--mirror URL] [--keep_roots N] [--no_upgrade]
#   --bin_dir DIR    coordinator, worker and trainctl: DIR/NAME, or Bazel's layout
#                    (DIR/coordinator/coordinator, DIR/worker/worker, DIR/client/trainctl);
#                    default: this checkout's bazel-bin (`bazel build //coordinator //worker
#                    //client:trainctl` first)
#   --tag NAME       the image's name (default mptrain:latest)
#   --cache_dir DIR  where the Debian roots are kept between runs (default $MPTRAIN_OCI_CACHE,
#                    else /var/cache/mptrain-oci): one tarball per package set, suite and
#                    mirror (root-KEY.tar, about 160 MB)
#   --keep_roots N   roots kept in the cache, newest first (default 2); older ones are deleted
#   --mirror URL     the Debian mirror (default: the first URI for bookworm in /etc/apt)
#   --no_upgrade     skip `apt-get upgrade` from bookworm-updates and bookworm-security (the
#                    root then has bookworm's release versions only)
# Prints, last, one line: "image TAG: ID, SIZE; root KEY (cached|made in Ns)".
set -euo pipefail
SUITE=bookworm
RECIPE_VERSION=1  # Bump when the root's making changes: the cache key includes it.
HERE=$(cd "$(dirname "$0")" && pwd)
CHECKOUT=$(cd "$HERE/../.." && pwd)

die() { echo "build_image: $*" >&2; exit 2; }
bin_dir=""
tag=mptrain:latest
cache_dir=${MPTRAIN_OCI_CACHE:-/var/cache/mptrain-oci}
mirror=""
keep_roots=2
upgrade=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bin_dir=*|--tag=*|--cache_dir=*|--mirror=*|--keep_roots=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
  esac
  case "$1" in
    --bin_dir) [ $# -ge 2 ] || die "$1 needs a value"; bin_dir=$2; shift 2 ;;
    --tag) [ $# -ge 2 ] || die "$1 needs a value"; tag=$2; shift 2 ;;
    --cache_dir) [ $# -ge 2 ] || die "$1 needs a value"; cache_dir=$2; shift 2 ;;
    --mirror) [ $# -ge 2 ] || die "$1 needs a value"; mirror=$2; shift 2 ;;
    --keep_roots) [ $# -ge 2 ] || die "$1 needs a value"; keep_roots=$2; shift 2 ;;
    --no_upgrade) upgrade=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--help)" ;;
  esac
done
[[ $keep_roots =~ ^[1-9][0-9]?$ ]] || die "--keep_roots '$keep_roots' is not 1..99"
[[ $tag =~ ^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]{1,128})?$ ]] || die "--tag '$tag' is not an image name"
[ "$(id -u)" -eq 0 ] || die "run as root (debootstrap and chroot need it)"
for program in debootstrap podman ldd dpkg-query tar sha256sum; do
  command -v $program >/dev/null || PATH=$PATH:/usr/sbin:/sbin command -v $program >/dev/null ||
    die "$program is missing (scripts/setup.sh installs debootstrap and podman)"
done
export PATH=$PATH:/usr/sbin:/sbin

# ---- The binaries ----
[ -n "$bin_dir" ] || bin_dir=$CHECKOUT/bazel-bin
binaries=()
for name in coordinator worker trainctl; do
  bazel_path=$name/$name
  [ $name = trainctl ] && bazel_path=client/trainctl
  if [ -f "$bin_dir/$name" ] && [ -x "$bin_dir/$name" ]; then binaries+=("$bin_dir/$name")
  elif [ -f "$bin_dir/$bazel_path" ] && [ -x "$bin_dir/$bazel_path" ]; then binaries+=("$bin_dir/$bazel_path")
  else die "no executable $name in --bin_dir $bin_dir (as $name or $bazel_path)"
  fi
done

# ---- Their libraries: Debian packages, or files to copy ----
# ldd prints "NAME => PATH (ADDR)"; a library that is missing fails the build here, not in the
# container.
libraries=$(ldd "${binaries[@]}" | awk '/=> not found/ {print "MISSING " $1} / => \// {print $3}' | sort -u)
if grep -q '^MISSING' <<<"$libraries"; then
  die "the binaries' libraries are not all found here: $(echo "$libraries" | grep '^MISSING' | tr '\n' ' ')"
fi
# Debian 12 has a merged /usr: dpkg knows /lib/x86_64-linux-gnu/libz.so.1 under /lib or /usr/lib,
# and a link's target under its own name. One dpkg-query for every name ("PACKAGE[:ARCH]: PATH").
names=()
for library in $libraries; do
  target=$(readlink -f "$library")
  names+=("$library" "$target" "/usr${library#/usr}" "${library#/usr}" "/usr${target#/usr}" "${target#/usr}")
done
owners=$(dpkg-query -S "${names[@]}" 2>/dev/null | sed -n 's/^\([^:, ]*\)\(:[a-z0-9]*\)\{0,1\}: \(.*\)$/\3 \1/p' || true)
packages=()
extra_files=()
for library in $libraries; do
  target=$(readlink -f "$library")
  # (A here-string, not echo |: awk leaves at its first match, and echo, writing a line at a
  # time, would die of SIGPIPE, which pipefail and set -e turned into a silent exit.)
  owner=$(awk -v a="$library" -v b="$target" -v c="/usr${library#/usr}" \
    -v d="${library#/usr}" -v e="/usr${target#/usr}" -v f="${target#/usr}" \
    '$1 == a || $1 == b || $1 == c || $1 == d || $1 == e || $1 == f {print $2; exit}' <<<"$owners")
  if [ -n "$owner" ]; then packages+=("$owner"); else extra_files+=("$library"); fi
done
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
# cuDNN loads its engines and sub-libraries itself (dlopen, so ldd does not list them): each
# libcudnn_*.so.N beside a libcudnn.so.N the binaries link comes along.
for file in "${extra_files[@]}"; do
  if [[ $(basename "$file") =~ ^libcudnn\.so\.([0-9]+)$ ]]; then
    for sibling in "$(dirname "$file")"/libcudnn_*.so.${BASH_REMATCH[1]}; do
      [ -e "$sibling" ] && extra_files+=("$sibling")
    done
  fi
done
echo "build_image: Debian packages: ${packages[*]}" >&2
[ ${#extra_files[@]} -eq 0 ] || echo "build_image: copied (no Debian package): ${extra_files[*]}" >&2

# ---- The mirror ----
if [ -z "$mirror" ]; then
  # deb822 (.sources: URIs:/Suites:) or one-line ("deb URL SUITE ...") sources.
  mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v suite=$SUITE '
    /^URIs:/ {uri=$2} /^Suites:/ {for (i = 2; i <= NF; i++) if ($i == suite && uri != "") {print uri; exit}}
    /^$/ {uri=""}')
  [ -n "$mirror" ] || mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    awk -v suite=$SUITE '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i == suite) {print (substr($2,1,1) == "[" ? $3 : $2); exit}}')
  [ -n "$mirror" ] || die "no Debian mirror for $SUITE in /etc/apt; give --mirror URL"
fi
[[ $mirror =~ ^(https?|file)://[^[:space:]\'\"]+$ ]] || die "--mirror '$mirror' is not a URL"
security_mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v suite=$SUITE-security '
    /^URIs:/ {uri=$2} /^Suites:/ {for (i = 2; i <= NF; i++) if ($i == suite && uri != "") {print uri; exit}}
    /^$/ {uri=""}')
[ -n "$security_mirror" ] || security_mirror=${mirror%/debian}/debian-security

# ---- The root: cached by what goes into it ----
key=$(printf '%s\n' "$RECIPE_VERSION" "$SUITE" "$mirror" "$security_mirror" "$upgrade" "${packages[@]}" |
      sha256sum | cut -c1-16)
mkdir -p "$cache_dir"
root_tar=$cache_dir/root-$key.tar
work=$(mktemp -d /var/tmp/mptrain-oci.XXXXXX)
cleanup() {
  # A failed debootstrap can leave /proc and /sys mounted in the root.
  for mountpoint in "$work/root/proc" "$work/root/sys" "$work/root/dev/pts" "$work/root/dev"; do
    mountpoint -q "$mountpoint" 2>/dev/null && umount -l "$mountpoint"
  done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
root_note=cached
if [ ! -f "$root_tar" ]; then
  started=$SECONDS
  echo "build_image: making the Debian root $key with debootstrap from $mirror (a few minutes)" >&2
  include=$(IFS=,; echo "${packages[*]}")
  if ! debootstrap --variant=minbase --include="$include" $SUITE "$work/root" "$mirror" \
        >"$work/debootstrap.log" 2>&1; then
    tail -n 20 "$work/debootstrap.log" >&2
    tail -n 20 "$work/root/debootstrap/debootstrap.log" 2>/dev/null >&2 || true
    die "debootstrap failed (its log above)"
  fi
  cat >"$work/root/etc/apt/sources.list" <<SOURCES
deb $mirror $SUITE main
deb $mirror $SUITE-updates main
deb $security_mirror $SUITE-security main
SOURCES
  if [ $upgrade -eq 1 ]; then
    # The security and point-release updates of those packages (the host's resolver).
    cp /etc/resolv.conf "$work/root/etc/resolv.conf"
    if ! chroot "$work/root" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -y -qq upgrade' \
          >"$work/upgrade.log" 2>&1; then
      tail -n 20 "$work/upgrade.log" >&2
      die "apt-get upgrade in the root failed (--no_upgrade skips it)"
    fi
    : >"$work/root/etc/resolv.conf"  # podman mounts its own.
  fi
  chroot "$work/root" groupadd --gid 10001 mptrain
  chroot "$work/root" useradd --uid 10001 --gid 10001 --home-dir /var/lib/mptrain \
    --no-create-home --shell /usr/sbin/nologin mptrain
  # The paths of deploy/kubernetes and scripts/systemd: the state and work directories the
  # user owns, the roots and credentials mounted over, the binaries also at /opt/mptrain/bin.
  install -d -o 10001 -g 10001 -m 0750 "$work/root/var/lib/mptrain" \
    "$work/root/var/lib/mptrain/state" "$work/root/var/lib/mptrain/work"
  install -d -m 0755 "$work/root/srv/mptrain/data" "$work/root/srv/mptrain/output" \
    "$work/root/etc/mptrain" "$work/root/opt/mptrain/bin"
  for name in coordinator worker trainctl; do ln -s /usr/local/bin/$name "$work/root/opt/mptrain/bin/$name"; done
  # Smaller: no package lists, archives, documentation or locales (apt-get update brings the
  # lists back).
  chroot "$work/root" apt-get clean
  rm -rf "$work/root"/var/lib/apt/lists/* "$work/root"/usr/share/doc/* "$work/root"/usr/share/man/* \
    "$work/root"/usr/share/info/* "$work/root"/var/log/*.log "$work/root"/var/cache/debconf/*-old \
    "$work/root/debootstrap"
  find "$work/root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  printf '%s\n' "${packages[@]}" >"$work/root/etc/mptrain/image-packages"
  tar --numeric-owner --xattrs -C "$work/root" -cf "$work/root.tar" .
  mv "$work/root.tar" "$root_tar.partial" && mv "$root_tar.partial" "$root_tar"
  rm -rf --one-file-system "$work/root"
  root_note="made in $((SECONDS - started)) s"
fi
touch "$root_tar"  # Newest use first, for the pruning below.
# Bounded: the newest --keep_roots roots stay.
ls -1t "$cache_dir"/root-*.tar 2>/dev/null | tail -n +$((keep_roots + 1)) | while read -r old; do
  echo "build_image: removing the older root $old" >&2
  rm -f "$old"
done

# ---- The image ----
context=$work/context
mkdir -p "$context/bin" "$context/extra"
ln "$root_tar" "$context/root.tar" 2>/dev/null || cp "$root_tar" "$context/root.tar"
for binary in "${binaries[@]}"; do install -m 0755 "$binary" "$context/bin/"; done
for file in "${extra_files[@]}"; do
  mkdir -p "$context/extra$(dirname "$file")"
  cp -L "$file" "$context/extra$file"
done
cp "$HERE/Containerfile" "$context/Containerfile"
previous=$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
version=$("${binaries[0]}" --version 2>/dev/null | head -n 1 | tr -cd 'A-Za-z0-9._+ -' || true)
if ! podman build --quiet --network=none --build-arg VERSION="${version:-unknown}" -t "$tag" \
      -f "$context/Containerfile" "$context" >"$work/build.log" 2>&1; then
  tail -n 20 "$work/build.log" >&2
  die "podman build failed (its output above)"
fi
id=$(podman image inspect --format '{{.Id}}' "$tag")
# Bounded: the image this tag named before goes, with its layers no other image uses (the
# build cache of this one stays).
if [ -n "$previous" ] && [ "$previous" != "$id" ] &&
   [ -z "$(podman image inspect --format '{{join .RepoTags ","}}' "$previous" 2>/dev/null)" ]; then
  podman rmi "$previous" >/dev/null 2>&1 || true
fi
id=$(echo "$id" | cut -c1-12)
size=$(podman image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1 / 1e6}')
echo "image $tag: $id, $size; root $key ($root_note)"
