"""The digits data set (1,797 8x8 images of handwritten digits, 10 classes, as shipped by Debian's
python3-sklearn in sklearn/datasets/data/digits.csv.gz) as .npy files for a job spec:

  python3 scripts/make_digits.py OUT_DIR

writes OUT_DIR/{train,test}_{x,y}.npy: float32 [N, 64] pixels scaled from 0..16 to 0..1, and
int64 [N] labels; a fixed shuffle (seed 0), then 1,437 rows for training and 360 for the test
set (80/20). Reads the file directly (numpy only), so no network and no scikit-learn import.
"""
import gzip
import os
import sys

import numpy as np


def find_csv():
    candidates = ["/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"]
    # The GPU machine has no sklearn: the device bundle carries Debian's file and names it here.
    if os.environ.get("MPTRAIN_DIGITS_CSV"):
        candidates.insert(0, os.environ["MPTRAIN_DIGITS_CSV"])
    try:
        import sklearn  # noqa: F401  (only to find its data folder)
        candidates.insert(0, os.path.join(os.path.dirname(sklearn.__file__), "datasets", "data",
                                          "digits.csv.gz"))
    except ImportError:
        pass
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise SystemExit("digits.csv.gz not found: install Debian's python3-sklearn "
                     "(scripts/setup.sh does)")


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_digits.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with gzip.open(find_csv(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float64)
    if table.shape != (1797, 65):
        raise SystemExit(f"digits.csv.gz: expected 1797 rows of 65 values, got {table.shape}")
    features = (table[:, :64] / 16.0).astype(np.float32)
    labels = table[:, 64].astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    features, labels = features[order], labels[order]
    split = 1437
    np.save(os.path.join(out, "train_x.npy"), features[:split])
    np.save(os.path.join(out, "train_y.npy"), labels[:split])
    np.save(os.path.join(out, "test_x.npy"), features[split:])
    np.save(os.path.join(out, "test_y.npy"), labels[split:])
    print(f"digits: {split} training and {len(labels) - split} test rows in {out}")


if __name__ == "__main__":
    main()
