#!/usr/bin/env bash
# The systemd units shipped in scripts/systemd/: `systemd-analyze verify` accepts them (their
# binaries pointed at the ones built here), or, where systemd-analyze is missing, every line is
# a comment, a [Section] or a Key=Value (except under CI, CI set and not empty: there a missing
# systemd-analyze fails the test; SYSTEMD_ANALYZE names another command, to check that); each
# unit restarts on failure, runs as the user mptrain, which both create with the same command
# (a host may run both: two different useradd lines would make the second fail), keeps its
# state under a StateDirectory and passes TLS files and a token; `systemd-analyze security
# --offline=yes` rates each at most its limit (the coordinator 3.0; the worker, which needs the
# GPU devices, /dev/shm and writable-executable memory for CUDA, 2.5); and each binary
# accepts every flag and value its ExecStart gives it (parsed for real, with --version).
set -uo pipefail
RUNFILES=${TEST_SRCDIR:-$(dirname "$0")/..}/${TEST_WORKSPACE:-mptrain}
WORK=${TEST_TMPDIR:-/tmp}/units.$$
mkdir -p "$WORK"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
SYSTEMD_ANALYZE=${SYSTEMD_ANALYZE:-systemd-analyze}

for unit in mptrain-coordinator mptrain-worker; do
  binary=${unit#mptrain-}
  sed "s|/opt/mptrain/bin/$binary|$RUNFILES/$binary/$binary|" \
    "$RUNFILES/scripts/systemd/$unit.service" >"$WORK/$unit.service"
  if command -v "$SYSTEMD_ANALYZE" >/dev/null; then
    if ! out=$("$SYSTEMD_ANALYZE" verify "$WORK/$unit.service" 2>&1) || [ -n "$out" ]; then
      fail "systemd-analyze verify $unit.service: $out"
    fi
  elif [ -n "${CI:-}" ]; then
    fail "systemd-analyze is not installed (Debian package systemd, which scripts/setup.sh" \
      "installs), and CI=$CI: cannot verify $unit.service"
  else
    echo "SKIPPED (systemd-analyze verify): systemd-analyze is not installed (Debian package" \
      "systemd): checking the syntax of $unit.service only"
    bad=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$WORK/$unit.service" |
          grep -Ev '^[[:space:]]*(#.*)?$|^\[[A-Za-z]+\]$|^[A-Za-z]+=')
    [ -z "$bad" ] || fail "$unit.service: lines that are not Key=Value: $bad"
  fi
  if command -v "$SYSTEMD_ANALYZE" >/dev/null; then
    limit=3.0
    [ "$unit" = mptrain-worker ] && limit=2.5
    # "→ Overall exposure level for X.service: 1.4 OK 🙂"
    score=$("$SYSTEMD_ANALYZE" security --offline=yes "$WORK/$unit.service" 2>&1 |
            sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
    if [ -z "$score" ]; then
      fail "systemd-analyze security --offline=yes $unit.service printed no exposure level"
    elif ! awk -v s="$score" -v l="$limit" 'BEGIN { exit !(s <= l) }'; then
      fail "systemd-analyze security rates $unit.service $score, above its limit $limit"
    else
      echo "$unit.service: exposure $score (limit $limit)"
    fi
  fi
  for required in '^Restart=on-failure$' '^User=[a-z]' '^StateDirectory=[a-z]' \
                  '--tls_ca=|--tls_cert=' '--token_file=' '^WantedBy=multi-user.target$'; do
    grep -Eq -- "$required" "$WORK/$unit.service" || fail "$unit.service has no $required"
  done
  # ExecStart, its continuation lines joined, %H as systemd would expand it.
  command=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$WORK/$unit.service" | grep '^ExecStart=' |
            sed -e 's/^ExecStart=//' -e "s/%H/$(hostname)/g")
  read -r -a argv <<<"$command"
  [ "${argv[0]}" = "$RUNFILES/$binary/$binary" ] || fail "$unit.service does not run $binary"
  if ! out=$("${argv[@]}" --version 2>&1); then
    fail "$binary refuses the flags of $unit.service: $out"
  fi
done
# The user: one name, created by the same (idempotent) command in both units' install steps.
useradd_lines() { grep -B1 useradd "$RUNFILES/scripts/systemd/$1.service"; }
[ -n "$(useradd_lines mptrain-coordinator)" ] || fail "the coordinator unit shows no useradd step"
[ "$(useradd_lines mptrain-coordinator)" = "$(useradd_lines mptrain-worker)" ] ||
  fail "the two units create their user differently: $(useradd_lines mptrain-coordinator) /" \
    "$(useradd_lines mptrain-worker)"
for unit in mptrain-coordinator mptrain-worker; do
  grep -q '^User=mptrain$' "$RUNFILES/scripts/systemd/$unit.service" ||
    fail "$unit.service does not run as User=mptrain"
done
[ "$(grep -c -- '--port_range=' "$RUNFILES/scripts/systemd/mptrain-worker.service")" -eq 1 ] ||
  fail "the worker unit does not set --port_range"

if [ $failures -ne 0 ]; then
  echo "$failures failed"
  exit 1
fi
echo "systemd units: both verified"
