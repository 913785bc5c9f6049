"""Global switches of kzoo, as `keras.config` holds Keras' own.

Fused training: kzoo's training ops (`kzoo.ops.softmax_dropout`,
`kzoo.ops.layer_norm`, `kzoo.ops.residual_dropout_layer_norm`, ...) each have
a plain `keras.ops` implementation and, under TensorFlow, a fused one: the
element-wise chain compiled as one XLA computation with its gradient written
out. The fused one runs where it helps (a training step traced into a
TensorFlow graph that is not itself compiled with XLA); everywhere else, and
always when fused training is off, the plain one runs. Both compute the same
values and gradients.
"""

_fused_training = True


def set_fused_training(enabled):
    """Turns kzoo's fused training ops on (the default) or off, everywhere.

    Takes effect for functions traced afterwards: set it before
    `model.fit` (a model that has trained already keeps its traced step
    until it is compiled again).

    Args:
        enabled: bool.

    Example:
    >>> kzoo.config.set_fused_training(False)  # plain keras.ops everywhere
    >>> kzoo.config.is_fused_training_enabled()
    False
    """
    if not isinstance(enabled, bool):
        raise ValueError(f"`enabled` must be a bool; received enabled={enabled!r}.")
    global _fused_training
    _fused_training = enabled


def is_fused_training_enabled():
    """Whether kzoo's training ops may run fused (see `set_fused_training`)."""
    return _fused_training
