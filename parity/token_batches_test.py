"""CI: TokenBatches (C++, through token_batches_dump) and parity/token_batches.py cut the same
micro-batches from the same files: world sizes 1-3, every rank, llm.c shards and raw files,
shard ends, wrapping into the next epoch, shuffling, and a resume by Seek.

    token_batches_test.py DUMP_BINARY WORK_DIR
"""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import token_batches  # noqa: E402


def write_shard(path, tokens):
    header = np.zeros(256, dtype="<i4")
    header[:3] = [token_batches.MAGIC, token_batches.VERSION, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def write_raw(path, tokens):
    with open(path, "wb") as f:
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def cpp_batches(dump, files, B, T, rank, world, count, shuffle, seed, seek=0):
    out = subprocess.run(
        [dump, str(B), str(T), str(rank), str(world), str(count), str(int(shuffle)), str(seed),
         str(seek)] + files, check=True, stdout=subprocess.PIPE).stdout
    values = np.frombuffer(out, dtype="<i4").reshape(count - seek, 2, B * T)
    return [(v[0], v[1]) for v in values]


def main():
    dump, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(0)
    files = []
    # Sizes: one a multiple of the windows below, others leaving tokens over; distinct tokens.
    for i, n in enumerate([193, 120, 241, 97]):
        path = os.path.join(work, f"train_{i:03d}.bin")
        tokens = rng.integers(0, 65536, size=n)
        (write_raw if i == 2 else write_shard)(path, tokens)
        files.append(path)
    cases = 0
    for world in (1, 2, 3):
        for B, T in ((1, 4), (2, 3), (3, 5)):
            if world * B * T + 1 > 97:
                continue
            windows = sum((n - 1) // (world * B * T) for n in (193, 120, 241, 97))
            count = 2 * windows + 3  # two whole epochs and into the third
            for shuffle, seed in ((False, 0), (True, 0), (True, 12345)):
                for rank in range(world):
                    expected = token_batches.batches(files, B, T, rank, world, count, shuffle, seed)
                    got = cpp_batches(dump, files, B, T, rank, world, count, shuffle, seed)
                    assert len(got) == len(expected)
                    for i, ((x, y), (ex, ey)) in enumerate(zip(got, expected)):
                        if not (np.array_equal(x, ex.ravel()) and np.array_equal(y, ey.ravel())):
                            raise SystemExit(
                                f"FAILED: micro-batch {i} differs (world {world} rank {rank} "
                                f"B {B} T {T} shuffle {shuffle} seed {seed})")
                    seek = windows + 2
                    resumed = cpp_batches(dump, files, B, T, rank, world, count, shuffle, seed,
                                          seek)
                    for (x, y), (ex, ey) in zip(resumed, expected[seek:]):
                        if not (np.array_equal(x, ex.ravel()) and np.array_equal(y, ey.ravel())):
                            raise SystemExit(f"FAILED: resumed at {seek}, batches differ "
                                             f"(world {world} rank {rank} shuffle {shuffle})")
                    cases += 1
    print(f"PASSED: {cases} configurations agree (C++ TokenBatches == parity/token_batches.py)")


if __name__ == "__main__":
    main()
