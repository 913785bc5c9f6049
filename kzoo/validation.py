"""Argument checks shared by kzoo layers, models and samplers.

Each raises `ValueError` naming the argument, the allowed range and the value.
"""

import math
import numbers
import sys

import numpy as np


def check_positive_int(name, value):
    """`value` as an int >= 1 (a Python or NumPy integer, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer; received {name}={value!r}.")
    return int(value)


def check_int(name, value, low, high):
    """`value` as an int in [low, high] (a Python or NumPy integer, not a bool).

    Example:
    >>> check_int("draft_tokens", 65, 1, 64)
    Traceback (most recent call last):
    ...
    ValueError: `draft_tokens` must be an int in [1, 64]; received draft_tokens=65.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
        raise ValueError(f"`{name}` must be an int in [{low}, {high}]; received {name}={value!r}.")
    return int(value)


def check_number(name, value, low=-math.inf, high=math.inf, *, low_open=True, high_open=True):
    """`value` as a float: a real number (not a bool, not a string), finite, in the interval
    from `low` to `high`, each end open or closed.

    Example:
    >>> check_number("p", 0.9, 0, 1, high_open=False)
    0.9
    >>> check_number("temperature", "0.5", low=0)
    Traceback (most recent call last):
    ...
    ValueError: `temperature` must be a finite number in (0, inf); received temperature='0.5'.
    """
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or not (low < value if low_open else low <= value)
        or not (value < high if high_open else value <= high)
    ):
        raise ValueError(f"`{name}` must be a finite number in {interval}; received {name}={value!r}.")
    return float(value)


def check_seed(name, value):
    """`value` as a seed: None, or an integer that fits in 64 bits (signed)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not -(2**63) <= value < 2**63:
        raise ValueError(f"`{name}` must be None or an integer in [-2**63, 2**63); received {name}={value!r}.")
    return int(value)


def check_rate(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be a float in [0, 1); received {name}={value!r}.")
    return float(value)


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {list(choices)}; received {name}={value!r}.")
    return value


def check_divisible(name, value, divisor_name, divisor):
    if value % divisor:
        raise ValueError(f"`{name}` ({value}) must be divisible by `{divisor_name}` ({divisor}).")


def clone_initializer(initializer):
    """A fresh instance per sublayer: Keras fixes an unseeded initializer's seed
    when the instance is made, so one instance shared by several sublayers
    would give them identical weights."""
    return initializer.__class__.from_config(initializer.get_config())


def imported_tensorflow():
    """TensorFlow where something has imported it, else None, without importing it (3-4 s): no
    TensorFlow tensor or graph exists before it is imported."""
    return sys.modules.get("tensorflow")


def is_text(x):
    """Whether `x` is meant as text: a string, a list / tuple / array holding one, or a string
    tensor (`kzoo.tokenizers.packing.check_text` then says whether it is good text). Asked
    without importing TensorFlow, which token ids under JAX or PyTorch may not have: a string
    tensor exists only once TensorFlow is imported."""
    if isinstance(x, (str, bytes)):
        return True
    if isinstance(x, (list, tuple, np.ndarray)):
        return any(isinstance(item, (str, bytes)) for item in np.asarray(x, object).reshape(-1))
    tf = imported_tensorflow()
    return tf is not None and isinstance(x, tf.Tensor) and x.dtype == tf.string
