"""The micro-batches of token files, as trainer/data/token_shards.h cuts them (README "Token
data"), written independently of the C++ for the PyTorch reference: numpy only.

    batches(files, B, T, rank, world, count, shuffle=False, seed=0) -> [(x, y), ...]

x and y are int64 arrays [B, T]; y is x shifted by one token. Window k of a file of n tokens
covers tokens [k*W*B*T, (k+1)*W*B*T + 1); there are (n - 1) // (W*B*T) windows; rank r reads the
B*T + 1 tokens at k*W*B*T + r*B*T. Files in order, windows in order, after the last file the
first again (llm.c's DataLoader). Shuffled: epoch e visits the files in the order
shuffled(len(files), stream(seed, e, 0)) and the file at position p of that order in the window
order shuffled(windows, stream(seed, e, p + 1)) (SplitMix64, Fisher-Yates, below).
"""
import os

import numpy as np

MAGIC = 20240520
VERSION = 1
HEADER_BYTES = 256 * 4
MASK = (1 << 64) - 1


def read_tokens(path, vocab_size=None):
    """The uint16 tokens of an llm.c shard (the magic first) or a raw uint16 file, validated."""
    with open(path, "rb") as f:
        first = f.read(4)
    size = os.path.getsize(path)
    if len(first) == 4 and int.from_bytes(first, "little", signed=True) == MAGIC:
        if size < HEADER_BYTES:
            raise ValueError(f"{path}: llm.c shard shorter than its header")
        header = np.fromfile(path, dtype="<i4", count=256)
        if header[1] != VERSION:
            raise ValueError(f"{path}: llm.c shard version is not {VERSION}")
        count = int(header[2])
        if count < 1 or size != HEADER_BYTES + 2 * count:
            raise ValueError(f"{path}: llm.c shard token count does not match its size")
        tokens = np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(count,))
    else:
        if size % 2:
            raise ValueError(f"{path}: a raw uint16 file must have an even size")
        tokens = np.memmap(path, dtype="<u2", mode="r", shape=(size // 2,)) if size else \
            np.zeros(0, dtype="<u2")
    if vocab_size is not None and len(tokens) and int(tokens.max()) >= vocab_size:
        raise ValueError(f"{path}: token {int(np.argmax(tokens >= vocab_size))} >= vocab_size")
    return tokens


class SplitMix64:
    def __init__(self, state):
        self.state = state & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, bound):
        """Uniform in [0, bound): values at or above 2^64 - (2^64 mod bound) are drawn again."""
        limit = (1 << 64) - (1 << 64) % bound
        while True:
            value = self.next()
            if value < limit:
                return value % bound


def mix(x):
    return SplitMix64(x).next()


def stream(seed, epoch, stream_index):
    return mix(mix(mix(seed) ^ epoch) ^ stream_index)


def shuffled(n, state):
    """Fisher-Yates on [0, n): for i = n-1 down to 1, swap a[i] with a[below(i + 1)]."""
    indices = list(range(n))
    rng = SplitMix64(state)
    for i in range(n - 1, 0, -1):
        j = rng.below(i + 1)
        indices[i], indices[j] = indices[j], indices[i]
    return indices


def batches(files, B, T, rank, world, count, shuffle=False, seed=0, vocab_size=None):
    shards = [read_tokens(path, vocab_size) for path in files]
    window = world * B * T
    windows = [(len(tokens) - 1) // window for tokens in shards]
    for path, n in zip(files, windows):
        if n < 1:
            raise ValueError(f"{path}: fewer than {window + 1} tokens, one window of every rank")
    out = []
    epoch = 0
    while True:
        order = shuffled(len(shards), stream(seed, epoch, 0)) if shuffle else range(len(shards))
        for slot, index in enumerate(order):
            window_order = (shuffled(windows[index], stream(seed, epoch, slot + 1)) if shuffle
                            else range(windows[index]))
            for k in window_order:
                if len(out) == count:
                    return out
                start = k * window + rank * B * T
                tokens = np.asarray(shards[index][start:start + B * T + 1], dtype=np.int64)
                out.append((tokens[:-1].reshape(B, T), tokens[1:].reshape(B, T)))
        epoch += 1
