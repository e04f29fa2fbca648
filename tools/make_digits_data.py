"""Write keras_vit/data/digits.npz: the 1,797 8x8 handwritten digits that scikit-learn ships, as uint8.

    python tools/make_digits_data.py   # needs scikit-learn

The images are the UCI "Optical Recognition of Handwritten Digits" test set
(E. Alpaydin, C. Kaynak, 1998; CC BY 4.0), as scikit-learn copies them
(`sklearn.datasets.load_digits`, BSD-3-Clause): pixel values 0..16, labels
0..9. Shipping them lets the digits job run without scikit-learn or
TensorFlow; keras_vit/data/digits_NOTICE.txt gives the attribution.
"""

import os

import numpy as np
from sklearn.datasets import load_digits

TARGET = os.path.join(os.path.dirname(__file__), "..", "keras_vit", "data", "digits.npz")


def main():
    digits = load_digits()
    images = digits.images.astype("uint8")
    assert np.array_equal(images, digits.images) and images.max() == 16 and images.shape == (1797, 8, 8)
    np.savez_compressed(TARGET, images=images, labels=digits.target.astype("uint8"))
    print(f"wrote {os.path.normpath(TARGET)} ({os.path.getsize(TARGET):,} bytes)")


if __name__ == "__main__":
    main()
