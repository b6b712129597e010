#!/usr/bin/env bash
# trainctl's command-line conventions, without a coordinator: -h/--help and per-verb help exit
# 0 on stdout; usage errors exit 2 with one line; -o is --output; --version names a version;
# the config file's contexts are written 0600 and picked up; a hostile config is refused by
# file and line without echoing it. The daemons' --help/--version/bad flags too.
set -uo pipefail
TRAINCTL=$1 COORDINATOR=$2 WORKER=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_rc() {  # expect_rc RC COMMAND...: runs it, output in $OUT
  local want=$1; shift
  OUT=$("$@" 2>&1); local rc=$?
  [ "$rc" -eq "$want" ] || fail "$* exited $rc, not $want: $OUT"
}
for bin in "$TRAINCTL" "$COORDINATOR" "$WORKER"; do
  for help in -h --help; do
    expect_rc 0 "$bin" $help
    grep -q "^usage: " <<<"$OUT" || fail "$bin $help printed no usage: $OUT"
  done
  expect_rc 0 "$bin" --version
  grep -Eq "^$(basename "$bin") [^ ]+ \((release|debug) build" <<<"$OUT" || fail "$bin --version: $OUT"
  grep -q "NDEBUG" <<<"$OUT" && fail "$bin --version is absl's default: $OUT"
  expect_rc 2 "$bin" --no_such_flag
  grep -q "unknown flag --no_such_flag" <<<"$OUT" || fail "$bin: $OUT"
done
expect_rc 0 "$TRAINCTL" help
expect_rc 0 "$TRAINCTL" help submit
grep -q "^trainctl submit FILE" <<<"$OUT" || fail "help submit: $OUT"
expect_rc 0 "$TRAINCTL" submit --help
grep -q "^trainctl submit FILE" <<<"$OUT" || fail "submit --help printed the global help: $OUT"
expect_rc 0 "$TRAINCTL" list -h
grep -q "^trainctl list" <<<"$OUT" || fail "list -h: $OUT"
expect_rc 2 "$TRAINCTL" help nosuch
expect_rc 2 "$TRAINCTL" nosuch
expect_rc 2 "$TRAINCTL" -o yaml list
grep -q -- "--output must be table or json" <<<"$OUT" || fail "-o is not --output: $OUT"
expect_rc 2 "$TRAINCTL" --timeout_ms=soon list
grep -q -- "--timeout_ms: the value must be an integer" <<<"$OUT" || fail "$OUT"
expect_rc 2 "$TRAINCTL" list --sort=size
expect_rc 2 "$TRAINCTL" cancel

# Contexts: set, listed, current, used (a coordinator nobody listens on: the error names it).
export MPTRAIN_CONFIG="$TEST_TMPDIR/mptrain/config"
expect_rc 0 "$TRAINCTL" config set-context unreachable --coordinator 127.0.0.1:9
[ "$(stat -c %a "$MPTRAIN_CONFIG")" = 600 ] || fail "config mode $(stat -c %a "$MPTRAIN_CONFIG")"
expect_rc 0 "$TRAINCTL" config set-context other --coordinator 127.0.0.1:10
expect_rc 0 "$TRAINCTL" config current-context
[ "$OUT" = unreachable ] || fail "current-context: $OUT"
expect_rc 0 "$TRAINCTL" config use-context other
expect_rc 0 "$TRAINCTL" config get-contexts
grep -Eq '^\*  +other +127.0.0.1:10' <<<"$OUT" || fail "get-contexts: $OUT"
expect_rc 1 "$TRAINCTL" --timeout_ms=2000 list
grep -q "127.0.0.1:10" <<<"$OUT" || fail "the current context's coordinator was not used: $OUT"
expect_rc 1 "$TRAINCTL" --context=unreachable --timeout_ms=2000 list
grep -q "127.0.0.1:9" <<<"$OUT" || fail "--context was not used: $OUT"
MPTRAIN_COORDINATOR=127.0.0.1:11 expect_rc 1 "$TRAINCTL" --timeout_ms=2000 list
grep -q "127.0.0.1:11" <<<"$OUT" || fail "MPTRAIN_COORDINATOR did not win over the context: $OUT"
expect_rc 1 "$TRAINCTL" config use-context nosuch
chmod 644 "$MPTRAIN_CONFIG"
expect_rc 1 "$TRAINCTL" list
grep -q "chmod 600" <<<"$OUT" || fail "a config others may read was used: $OUT"
printf '[context a]\nroot:SECRET-HASH\n' >"$MPTRAIN_CONFIG"; chmod 600 "$MPTRAIN_CONFIG"
expect_rc 1 "$TRAINCTL" list
grep -q "config file $MPTRAIN_CONFIG line 2" <<<"$OUT" || fail "hostile config: $OUT"
grep -q SECRET <<<"$OUT" && fail "the config's line was echoed: $OUT"
echo PASS
