"""A byte-level text corpus as llm.c token shards, for a language model with vocab_size 256 (every
byte is a token; its id is the byte's value):

  python3 scripts/make_text_shards.py OUT_DIR [--text FILE] [--val_percent 5] [--shard_tokens N]

The text: by default the King James Bible as Debian's bible-kjv ships it (scripts/setup.sh
installs it; `bible -f Gen1:1-Rev22:21`: 31,102 verses, one a line, the "Ge1:1 " reference cut
off each, about 4.3 MB of ASCII); or any FILE, read as bytes. The last --val_percent percent of
the bytes become OUT_DIR/val_000.bin, the rest OUT_DIR/train_000.bin, train_001.bin, ... of at
most --shard_tokens tokens each (default 1 MiB), each an llm.c shard: 256 little-endian int32
(20240520, 1, token count, then zeros) and the tokens as little-endian uint16. Old train_*.bin
and val_*.bin in OUT_DIR are removed first (a data.tokens pattern would pick them up).
Deterministic: the same text gives the same files. Prints the token counts, and the unigram
entropy of the training bytes in bits per byte (what a model that learned only the byte
frequencies would score: a validation loss of that many nats * log2(e)).
"""
import argparse
import glob
import math
import os
import re
import subprocess
import sys

import numpy as np

MAGIC = 20240520
VERSION = 1


def kjv_text():
    try:
        # -f: one verse a line, never wrapped (whatever COLUMNS says).
        out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             env={"PATH": os.environ.get("PATH", "")}).stdout
    except FileNotFoundError:
        sys.exit("make_text_shards: no `bible` program: install Debian's bible-kjv "
                 "(bash scripts/setup.sh), or pass --text FILE")
    lines = out.decode("ascii").splitlines()
    reference = re.compile(r"^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ ")
    verses = []
    for line in lines:
        match = reference.match(line)
        if not match:
            sys.exit(f"make_text_shards: unexpected line from bible: {line[:60]!r}")
        verses.append(line[match.end():])
    if len(verses) != 31102:
        sys.exit(f"make_text_shards: expected 31102 verses from bible, got {len(verses)}")
    return ("\n".join(verses) + "\n").encode("ascii")


def write_shard(path, tokens):
    header = np.zeros(256, dtype="<i4")
    header[:3] = [MAGIC, VERSION, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--text", help="a text file to use instead of the KJV Bible")
    parser.add_argument("--val_percent", type=float, default=5.0)
    parser.add_argument("--shard_tokens", type=int, default=1 << 20)
    args = parser.parse_args()
    if not 0 < args.val_percent < 100:
        sys.exit("make_text_shards: --val_percent must be in (0, 100)")
    if not 1 <= args.shard_tokens <= (1 << 31) - 1:
        sys.exit("make_text_shards: --shard_tokens must be in [1, 2^31 - 1]")
    if args.text:
        with open(args.text, "rb") as f:
            data = f.read()
    else:
        data = kjv_text()
    tokens = np.frombuffer(data, dtype=np.uint8)
    val_tokens = max(1, int(math.ceil(len(tokens) * args.val_percent / 100)))
    if len(tokens) - val_tokens < 2:
        sys.exit("make_text_shards: the text is too short to split")
    train, val = tokens[:-val_tokens], tokens[-val_tokens:]

    os.makedirs(args.out_dir, exist_ok=True)
    for old in glob.glob(os.path.join(args.out_dir, "train_*.bin")) + \
            glob.glob(os.path.join(args.out_dir, "val_*.bin")):
        os.remove(old)
    shards = []
    for i, start in enumerate(range(0, len(train), args.shard_tokens)):
        path = os.path.join(args.out_dir, f"train_{i:03d}.bin")
        write_shard(path, train[start:start + args.shard_tokens])
        shards.append((path, len(train[start:start + args.shard_tokens])))
    val_path = os.path.join(args.out_dir, "val_000.bin")
    write_shard(val_path, val)
    shards.append((val_path, len(val)))

    counts = np.bincount(train, minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    entropy = float(-(p * np.log2(p)).sum())
    for path, n in shards:
        print(f"{path}: {n} tokens")
    print(f"train {len(train)} tokens in {len(shards) - 1} shard(s), val {len(val)} tokens; "
          f"{int((counts > 0).sum())} distinct bytes; unigram entropy of train "
          f"{entropy:.3f} bits per byte")


if __name__ == "__main__":
    main()
