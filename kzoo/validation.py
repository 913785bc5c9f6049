"""Argument checks shared by kzoo layers, models and samplers.

Each raises `ValueError` naming the argument, the allowed range and the value.
"""


def check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer; received {name}={value!r}.")
    return value


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
