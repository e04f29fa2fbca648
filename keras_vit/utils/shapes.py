"""Reading sizes: `as_pair` turns an image, patch or grid size into `(height, width)`."""

import numbers


def as_pair(value, name):
    """`7` -> `(7, 7)`; a `(height, width)` pair of positive ints is returned as a tuple.

    Strings, floats and booleans are refused rather than coerced: `"32"` is
    not `(3, 2)`.
    """

    def is_int(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)

    pair = (value, value) if is_int(value) else value
    if isinstance(pair, (str, bytes)) or not isinstance(pair, (tuple, list)) or len(pair) != 2 \
            or not all(is_int(v) for v in pair):
        raise ValueError(f"{name} must be an int or (height, width) of ints, got {value!r}.")
    if min(pair) < 1:
        raise ValueError(f"{name} must be positive, got {value!r}.")
    return (int(pair[0]), int(pair[1]))
