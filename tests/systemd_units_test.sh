#!/usr/bin/env bash
# The systemd units shipped in scripts/systemd/: `systemd-analyze verify` accepts them (their
# binaries pointed at the ones built here), or, where systemd-analyze is missing, every line is
# a comment, a [Section] or a Key=Value (except under CI, CI set and not empty: there a missing
# systemd-analyze fails the test; SYSTEMD_ANALYZE names another command, to check that); each unit restarts on failure, runs as a user of its
# own, keeps its state under a StateDirectory and passes TLS files and a token; and each binary
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
[ "$(grep -c -- '--port_range=' "$RUNFILES/scripts/systemd/mptrain-worker.service")" -eq 1 ] ||
  fail "the worker unit does not set --port_range"

if [ $failures -ne 0 ]; then
  echo "$failures failed"
  exit 1
fi
echo "systemd units: both verified"
