import json
import os

import tensorflow as tf

STRATEGY_NAMES = ("auto", "cpu", "gpu", "mirrored", "multi_worker", "tpu")


def get_strategy(name="auto"):
    """The `tf.distribute.Strategy` that a recipe trains under.

    - "auto": a TPU if one is found (`TPU_NAME`, a Cloud TPU VM, or a TPU
      node on GCE); else a multi-worker cluster if `TF_CONFIG` lists more
      than one task; else `MirroredStrategy` over the local GPUs if there
      are several, `OneDeviceStrategy` on the only GPU, or the default
      strategy (one CPU).
    - "cpu": `OneDeviceStrategy` on the CPU.
    - "gpu", "mirrored": `MirroredStrategy` over all local GPUs.
    - "multi_worker": `MultiWorkerMirroredStrategy` over the cluster that
      `TF_CONFIG` describes, or, without it, the SLURM job step that
      `SlurmClusterResolver` reads from the `SLURM_*` variables of `srun`.
    - "tpu": `TPUStrategy` on the TPU that "auto" would find.

    Create the strategy at the start of the program, before any other
    TensorFlow operation: multi-worker and TPU strategies set up the
    runtime.

    Args:
        name: one of `STRATEGY_NAMES`.

    Raises:
        ValueError: for an unknown name, or when the devices or cluster the
            name asks for are not there.
    """
    if name not in STRATEGY_NAMES:
        raise ValueError(f"Unknown strategy {name!r}; expected one of {', '.join(STRATEGY_NAMES)}.")
    if name == "cpu":
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    if name in ("gpu", "mirrored"):
        if not tf.config.list_physical_devices("GPU"):
            raise ValueError(f"Strategy {name!r} needs a GPU and none is visible; use 'cpu' or 'auto'.")
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        return _multi_worker_strategy()
    tpu = _tpu_cluster_resolver()
    if name == "tpu":
        if tpu is None:
            raise ValueError("Strategy 'tpu' found no TPU: set TPU_NAME to the TPU's name, or run on a Cloud TPU VM.")
        return _tpu_strategy(tpu)
    if tpu is not None:
        return _tpu_strategy(tpu)
    cluster = _tf_config().get("cluster", {})
    if len(cluster.get("chief", [])) + len(cluster.get("worker", [])) > 1:
        return _multi_worker_strategy()
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy()
    if len(gpus) == 1:
        return tf.distribute.OneDeviceStrategy("/gpu:0")
    return tf.distribute.get_strategy()


def _tf_config():
    text = os.environ.get("TF_CONFIG")
    if not text:
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON ({error}): {text!r}") from None


def _multi_worker_strategy():
    tf_config = _tf_config()
    if tf_config:
        if not tf_config.get("cluster") or not tf_config.get("task"):
            raise ValueError(f"TF_CONFIG needs a 'cluster' and a 'task'; received {os.environ['TF_CONFIG']!r}.")
        return tf.distribute.MultiWorkerMirroredStrategy()
    if "SLURM_PROCID" in os.environ:
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver()
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    raise ValueError(
        "Strategy 'multi_worker' needs a cluster: set TF_CONFIG on every worker, e.g. "
        '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}, '
        "or start the workers with SLURM's srun."
    )


def _tpu_cluster_resolver():
    """The resolver of the TPU this program can use, or None."""
    try:
        # Finds a TPU named by TPU_NAME, or the TPU node of a GCE VM.
        return tf.distribute.cluster_resolver.TPUClusterResolver()
    except (ValueError, RuntimeError, ImportError):
        pass
    # A Cloud TPU VM: the TPU is attached to this host.
    if tf.config.list_physical_devices("TPU"):
        return tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
    return None


def _tpu_strategy(resolver):
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
