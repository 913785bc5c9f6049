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
    """`TF_CONFIG` as a dict ({} when unset), its shape checked: TensorFlow's resolver and the
    cluster count above would otherwise fail on a malformed one with a raw AttributeError.

    Raises:
        ValueError: naming TF_CONFIG, what is wrong in it and its text.
    """
    text = os.environ.get("TF_CONFIG")
    if not text:
        return {}
    try:
        tf_config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON ({error}): {text!r}") from None
    problems = _tf_config_problems(tf_config)
    if problems:
        raise ValueError(
            "TF_CONFIG must be a JSON object such as "
            '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}; '
            f"in {text!r}: " + "; ".join(problems) + "."
        )
    return tf_config


def _tf_config_problems(tf_config):
    """What is wrong with a parsed `TF_CONFIG`: a list of sentences, empty when nothing is."""
    if not isinstance(tf_config, dict):
        return [f"it is a JSON {_json_kind(tf_config)}, not an object"]
    problems = []
    cluster = tf_config.get("cluster", {})
    if not isinstance(cluster, dict):
        problems.append(
            f"'cluster' must map task types to lists of 'host:port' addresses; it is a {_json_kind(cluster)} "
            f"({json.dumps(cluster)[:80]})"
        )
        cluster = {}
    for task_type, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(isinstance(address, str) for address in addresses):
            problems.append(
                f"cluster[{task_type!r}] must be a list of 'host:port' strings; it is {json.dumps(addresses)[:80]}"
            )
    task = tf_config.get("task", {})
    if not isinstance(task, dict):
        return problems + [f"'task' must be an object with a 'type' and an 'index'; it is {json.dumps(task)[:80]}"]
    task_type, index = task.get("type"), task.get("index", 0)
    if task and not isinstance(task_type, str):
        problems.append(f"task 'type' must be a string such as 'worker'; it is {json.dumps(task_type)[:80]}")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        problems.append(f"task 'index' must be an integer >= 0; it is {json.dumps(index)[:80]}")
    elif isinstance(cluster.get(task_type), list) and index >= len(cluster[task_type]):
        problems.append(
            f"task 'index' is {index}, but cluster[{task_type!r}] lists {len(cluster[task_type])} address(es)"
        )
    return problems


def _json_kind(value):
    """The JSON name of a parsed value's type, for messages."""
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


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
