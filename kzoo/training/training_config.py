import dataclasses

import keras
import tensorflow as tf

from kzoo.training.strategy import get_strategy

DTYPE_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """Where and how a recipe trains: what `configure` returns.

    Attributes:
        strategy: the `tf.distribute.Strategy`; create and compile the model
            in `strategy.scope()`.
        dtype_policy: str, the global Keras dtype policy now in effect.
        jit_compile: bool or "auto", for `model.compile(jit_compile=...)`.
    """

    strategy: tf.distribute.Strategy
    dtype_policy: str
    jit_compile: bool | str

    def per_replica_batch_size(self, global_batch_size):
        """B / N for N replicas in sync; raises unless N divides B.

        Keras averages each replica's loss over its own examples, then the
        gradients over replicas: with unequal shares, examples would weigh
        unequally, and the run would differ from one on a single device.
        """
        replicas = self.strategy.num_replicas_in_sync
        if global_batch_size % replicas:
            raise ValueError(
                f"The global batch size {global_batch_size} does not split evenly over {replicas} replicas."
            )
        return global_batch_size // replicas


def configure(strategy="auto", mixed_precision=False, jit_compile="auto"):
    """Picks the strategy and sets the global dtype policy, for a recipe's flags.

    Call it first, then build and compile the model under
    `config.strategy.scope()` with `jit_compile=config.jit_compile`. With
    "mixed_float16", `compile()` wraps the optimizer in Keras'
    `LossScaleOptimizer` (dynamic loss scaling, `auto_scale_loss=True`);
    bfloat16 has float32's range and needs none.

    Args:
        strategy: a name for `get_strategy`, or a `tf.distribute.Strategy`.
        mixed_precision: False (float32); True for the usual policy of the
            strategy's devices, "mixed_float16" on GPUs and "mixed_bfloat16"
            on TPUs and CPUs; or a policy name from `DTYPE_POLICIES`.
        jit_compile: bool, or "auto" to let Keras decide (it turns XLA off
            under `tf.distribute` and on CPU; TPUs always compile).

    Returns:
        A `TrainingConfig`.

    Example:
    >>> config = kzoo.training.configure("auto", mixed_precision=True)
    >>> with config.strategy.scope():
    ...     model = kzoo.models.GPTCausalLM.from_preset("gpt_tiny")
    ...     model.compile(jit_compile=config.jit_compile)
    >>> model.dtype_policy.name == config.dtype_policy  # mixed_bfloat16 on a CPU, mixed_float16 on GPUs
    True
    """
    if isinstance(strategy, str):
        strategy = get_strategy(strategy)
    if mixed_precision is True:
        mixed_precision = "mixed_float16" if _has_gpus(strategy) else "mixed_bfloat16"
    policy = mixed_precision or "float32"
    if policy not in DTYPE_POLICIES:
        raise ValueError(
            f"Unknown `mixed_precision` {mixed_precision!r}; expected a bool or one of {', '.join(DTYPE_POLICIES)}."
        )
    if jit_compile not in (True, False, "auto"):
        raise ValueError(f'`jit_compile` must be True, False or "auto"; received {jit_compile!r}.')
    keras.config.set_dtype_policy(policy)
    return TrainingConfig(strategy=strategy, dtype_policy=policy, jit_compile=jit_compile)


def _has_gpus(strategy):
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return False
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:
        # The default strategy has no device list; it runs on the first GPU if there is one.
        devices = [device.name for device in tf.config.list_logical_devices()]
    return any("GPU" in device.upper() for device in devices)
