"""Run-time checks that `keras.ops` cannot express: it has no assertion op."""

import contextlib
import contextvars

import keras
from keras import ops

# Set while a caller that checked its ids on the host traces (`checked_by_caller`).
_CHECKED_BY_CALLER = contextvars.ContextVar("kzoo_token_ids_checked_by_caller", default=False)


@contextlib.contextmanager
def checked_by_caller():
    """Code run or traced within it makes no run-time check of its token ids (`check_token_ids`
    still gives the mask): its caller checked them on the host. Generation does (its prompts, before
    the compiled loop; the ids the loop samples are in the vocabulary by construction), and
    under JAX the check's host callback would keep the loop out of the persistent compilation
    cache and cost a host round trip per step.

    Example:
    >>> with checked_by_caller():
    ...     ids, valid = check_token_ids(keras.ops.array([1, 7]), 5)
    >>> keras.ops.convert_to_numpy(valid).tolist()
    [True, False]
    """
    token = _CHECKED_BY_CALLER.set(True)
    try:
        yield
    finally:
        _CHECKED_BY_CALLER.reset(token)


def check_token_ids(token_ids, vocabulary_size, name="token_ids"):
    """Fails loudly when any id is outside `[0, vocabulary_size)`.

    An embedding lookup with a bad id is silently wrong on most devices: TF on
    GPU returns zeros and XLA clamps the index to the last row. This check
    raises instead:

    - TensorFlow, eager or `tf.function`: `InvalidArgumentError` naming the
      argument and the range. XLA (`jit_compile=True`) drops assertions, so
      the caller also gets `valid_mask` to poison the bad rows with NaN.
    - JAX: `ValueError` eagerly, and from compiled code on CPU through a
      `jax.debug.callback`. On a GPU or TPU that callback would make every
      step wait for the host, so compiled code there relies on
      `valid_mask`'s NaN rows, as under TensorFlow's XLA.
    - PyTorch: a plain Python check.

    Traced within `checked_by_caller()`, none of these: the mask alone.

    Args:
        token_ids: integer tensor of any shape.
        vocabulary_size: int, the exclusive upper bound.
        name: the argument name used in the error message.

    Returns:
        `(token_ids, valid_mask)`: the ids (with a control dependency on the
        check where the backend needs one) and a boolean tensor, True where
        the id is in range.

    Example:
    >>> ids, valid = check_token_ids(keras.ops.array([1, 2]), 5)
    >>> keras.ops.convert_to_numpy(ids).tolist()
    [1, 2]
    """
    message = f"`{name}` must be in [0, {vocabulary_size}) (vocabulary_size={vocabulary_size})."
    valid = ops.logical_and(ops.greater_equal(token_ids, 0), ops.less(token_ids, vocabulary_size))
    if _CHECKED_BY_CALLER.get():
        return token_ids, valid
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        check = tf.debugging.Assert(
            tf.reduce_all(valid),
            [message, "min:", tf.reduce_min(token_ids), "max:", tf.reduce_max(token_ids)],
            summarize=1,
        )
        with tf.control_dependencies([check]):
            token_ids = tf.identity(token_ids)
    elif backend == "jax" and _traced_by_jax(token_ids):
        import jax

        # Compiled: only on CPU, where the host callback is cheap (see above).
        if jax.default_backend() == "cpu":

            def raise_if_invalid(all_valid, low, high):
                if not all_valid:
                    raise ValueError(f"{message} Got min={low}, max={high}.")

            jax.debug.callback(raise_if_invalid, ops.all(valid), ops.min(token_ids), ops.max(token_ids))
    elif not bool(ops.all(valid)):
        raise ValueError(f"{message} Got min={int(ops.min(token_ids))}, max={int(ops.max(token_ids))}.")
    return token_ids, valid


def _traced_by_jax(x):
    """Whether `x` is a JAX tracer (inside `jax.jit`), not a concrete array."""
    import jax

    return isinstance(x, jax.core.Tracer)
