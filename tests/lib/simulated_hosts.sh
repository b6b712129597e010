# Simulated hosts for the multi-host tests (sourced): network namespaces on one bridge, each
# with its own address (10.77.$ID.1i), its own hostname (hI) and, for workers, its own disk (a
# private tmpfs mounted over $WORK/disk, so the same path holds different files per host). The
# caller sets N_HOSTS before sourcing; cleanup runs on exit.
#
#   hosts_up                 build the bridge and hosts 0..N_HOSTS-1
#   on_host I CMD...         run CMD on host I (own network, hostname)
#   on_host_with_disk I CMD  the same, with the host's private disk at $WORK/disk
#   hosts_ipv6_only          give every host an IPv6 address ($NET6.1i) instead of its IPv4 one
#   link_down I / link_up I  pull / plug host I's cable (at the bridge)
#   partition I J            hosts I and J silently drop each other's packets (both still reach
#                            everybody else): each gets a neighbour entry with a MAC nobody has
#   kill_host I              kill -9 every process of host I

# Without root, ip netns or unshare the test skips (exit 0), except under CI (CI set and not
# empty; .bazelrc passes it with --test_env=CI), where it fails naming what is missing: CI runs
# as root after scripts/setup.sh installed iproute2 and util-linux.
simulated_hosts_missing=()
[ "$(id -u)" -eq 0 ] || simulated_hosts_missing+=("root (uid $(id -u))")
if ! command -v ip >/dev/null; then
  simulated_hosts_missing+=("the ip command (Debian package iproute2)")
elif ! ip netns list >/dev/null 2>&1; then
  simulated_hosts_missing+=("network namespaces (ip netns list failed)")
fi
command -v unshare >/dev/null || simulated_hosts_missing+=("unshare (Debian package util-linux)")
if [ ${#simulated_hosts_missing[@]} -ne 0 ]; then
  if [ -n "${CI:-}" ]; then
    echo "FAIL: cannot simulate hosts, missing: ${simulated_hosts_missing[*]}; under CI=$CI" \
      "this test must run, not skip"
    exit 1
  fi
  echo "SKIPPED: cannot simulate hosts, missing: ${simulated_hosts_missing[*]}"
  exit 0
fi

# The hosts' prefix (mph<ID>: namespaces, links, the 10.77.<ID> network), claimed by creating
# the bridge's namespace here: `ip netns add` fails where the name exists, so two tests running
# at once (or what a killed one left behind) never share hosts, and cleanup removes only ours.
simulated_hosts_claimed=0
for k in $(seq 0 199); do
  ID=$(( ($$ + k) % 200 + 20 ))
  if ip netns add mph${ID}br 2>/dev/null; then simulated_hosts_claimed=1; break; fi
done
if [ $simulated_hosts_claimed -ne 1 ]; then
  echo "FAIL: no free prefix for simulated hosts (namespaces mph20br..mph219br all exist)"
  exit 1
fi
P=mph$ID
NET=10.77.$ID
NET6=fd77:$ID:  # + ":1I": an address of host I once hosts_ipv6_only ran
WORK=${TEST_TMPDIR:-/tmp}/multihost.$$
mkdir -p "$WORK/disk"

hosts_cleanup() {
  local i
  [ $simulated_hosts_claimed -eq 1 ] || return 0
  simulated_hosts_claimed=0  # once: the prefix may be another test's after this
  for i in $(seq 0 $((N_HOSTS - 1))) br; do
    for pid in $(ip netns pids ${P}$i 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
  done
  sleep 0.2
  for i in $(seq 0 $((N_HOSTS - 1))) br; do ip netns del ${P}$i 2>/dev/null; done
  return 0
}
trap hosts_cleanup EXIT

hosts_up() {
  ip -n ${P}br link add br0 type bridge
  ip -n ${P}br link set br0 up
  local i ns
  for i in $(seq 0 $((N_HOSTS - 1))); do
    ns=${P}$i
    ip netns add "$ns"
    ip link add ${P}h$i type veth peer name ${P}b$i
    ip link set ${P}h$i netns "$ns"
    ip link set ${P}b$i netns ${P}br
    ip -n ${P}br link set ${P}b$i master br0
    ip -n ${P}br link set ${P}b$i up
    ip -n "$ns" link set lo up
    ip -n "$ns" link set ${P}h$i name eth0
    ip -n "$ns" addr add $NET.1$i/24 dev eth0
    ip -n "$ns" link set eth0 up
  done
}

hosts_ipv6_only() {
  local i
  for i in $(seq 0 $((N_HOSTS - 1))); do
    ip -n ${P}$i addr del $NET.1$i/24 dev eth0
    ip -n ${P}$i addr add $NET6:1$i/64 dev eth0 nodad  # (no duplicate detection: usable at once)
  done
}

on_host() {  # INDEX COMMAND...
  local i=$1; shift
  ip netns exec ${P}$i unshare --uts sh -c "hostname h$i && exec \"\$@\"" sh "$@"
}

on_host_with_disk() {  # INDEX COMMAND...
  local i=$1; shift
  ip netns exec ${P}$i unshare --uts --mount --propagation private sh -c \
    "mount -t tmpfs -o size=256m tmpfs '$WORK/disk' && hostname h$i && exec \"\$@\"" sh "$@"
}

link_down() { ip -n ${P}br link set ${P}b$1 down; }
link_up() { ip -n ${P}br link set ${P}b$1 up; }

partition() {  # I J
  ip -n ${P}$1 neigh replace $NET.1$2 lladdr 02:00:00:00:00:$(printf %02x "$2") dev eth0 nud permanent
  ip -n ${P}$2 neigh replace $NET.1$1 lladdr 02:00:00:00:00:$(printf %02x "$1") dev eth0 nud permanent
}

kill_host() {
  for pid in $(ip netns pids ${P}$1 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
}

# Processes of host I whose command line contains PATTERN.
host_processes() {  # I PATTERN
  local pid
  for pid in $(ip netns pids ${P}$1 2>/dev/null); do
    tr '\0' ' ' </proc/$pid/cmdline 2>/dev/null | grep -q -- "$2" && echo "$pid"
  done
  return 0
}
