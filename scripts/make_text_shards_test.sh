#!/usr/bin/env bash
# scripts/make_text_shards.py: the shards hold the text's bytes, split train / val at the last
# --val_percent, in llm.c's format (read back by parity/token_batches.py), the same on a rerun;
# and the KJV text (Debian's bible-kjv: under CI it must be installed) gives its known size.
set -euo pipefail
PYTHON=/usr/bin/python3
root="$TEST_SRCDIR/$TEST_WORKSPACE"
script="$root/scripts/make_text_shards.py"
work="$TEST_TMPDIR/shards"
mkdir -p "$work"
"$PYTHON" -c "import sys; sys.stdout.buffer.write(bytes(range(256)) * 40)" >"$work/text"
# A stale shard from an earlier run must go (a train_*.bin pattern would read it).
mkdir -p "$work/out"
touch "$work/out/train_009.bin"
"$PYTHON" -B "$script" "$work/out" --text "$work/text" --val_percent 10 --shard_tokens 4000 \
  >"$work/log"
cat "$work/log"
"$PYTHON" -B - "$root/parity" "$work" <<'PY'
import os, sys
sys.path.insert(0, sys.argv[1])
import token_batches
work = sys.argv[2]
text = open(os.path.join(work, "text"), "rb").read()
names = sorted(os.listdir(os.path.join(work, "out")))
assert names == ["train_000.bin", "train_001.bin", "train_002.bin", "val_000.bin"], names
tokens = [bytes(token_batches.read_tokens(os.path.join(work, "out", n)).astype("u1"))
          for n in names]
assert [len(t) for t in tokens] == [4000, 4000, 1216, 1024], [len(t) for t in tokens]
assert b"".join(tokens) == text, "the shards do not hold the text's bytes in order"
PY
md5sum "$work"/out/* >"$work/first.md5"
"$PYTHON" -B "$script" "$work/out" --text "$work/text" --val_percent 10 --shard_tokens 4000 \
  >/dev/null
md5sum -c --quiet "$work/first.md5"
if command -v bible >/dev/null; then
  "$PYTHON" -B "$script" "$work/kjv" >"$work/kjv.log"
  grep -q "train 3930957 tokens in 4 shard(s), val 206893 tokens" "$work/kjv.log" ||
    { cat "$work/kjv.log"; echo "FAILED: the KJV text's token counts changed"; exit 1; }
elif [ "${CI:-}" = "true" ]; then
  echo "FAILED: no bible program (bash scripts/setup.sh installs bible-kjv)"
  exit 1
else
  echo "skipped the KJV part: no bible program (bash scripts/setup.sh installs bible-kjv)"
fi
echo "PASSED"
