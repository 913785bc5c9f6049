import json

import keras
import pytest
import tensorflow as tf

import kzoo.training


def test_unknown_strategy_names_the_choices():
    with pytest.raises(ValueError, match="'gpus'.*auto, cpu, gpu, mirrored, multi_worker, tpu"):
        kzoo.training.get_strategy("gpus")


@pytest.mark.parametrize("name", ["multi_worker", "tpu", "gpu", "mirrored"])
def test_strategy_without_its_hardware_or_cluster_is_a_clear_error(name, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    monkeypatch.delenv("TPU_NAME", raising=False)
    if name in ("gpu", "mirrored") and tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    message = {"multi_worker": "TF_CONFIG.*srun", "tpu": "no TPU", "gpu": "needs a GPU", "mirrored": "needs a GPU"}
    with pytest.raises(ValueError, match=message[name]):
        kzoo.training.get_strategy(name)


@pytest.mark.parametrize(
    "tf_config, message",
    [("{not json", "not valid JSON"), (json.dumps({"cluster": {"worker": ["a:1"]}}), "needs a 'cluster' and a 'task'")],
)
def test_bad_tf_config_is_a_clear_error(tf_config, message, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(ValueError, match=message):
        kzoo.training.get_strategy("multi_worker")


@pytest.mark.parametrize("name", ["multi_worker", "auto"])
@pytest.mark.parametrize(
    "tf_config, message",
    [
        (
            '{"cluster": 5, "task": "x"}',
            "'cluster' must map task types to lists of 'host:port' addresses; it is a number",
        ),
        ("[]", "it is a JSON array, not an object"),
        (
            '{"cluster": {"worker": "notalist"}, "task": {"type": "worker", "index": "a"}}',
            "cluster['worker'] must be a list of 'host:port' strings; it is \"notalist\"; "
            "task 'index' must be an integer >= 0; it is \"a\"",
        ),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}', "lists 1 address(es)"),
    ],
    ids=["cluster_a_number", "an_array", "addresses_and_index_not_lists_and_ints", "index_past_the_cluster"],
)
def test_a_malformed_tf_config_is_named_not_an_attribute_error(name, tf_config, message, monkeypatch):
    """Garbage in TF_CONFIG is refused with what is wrong in it, before TensorFlow reads it."""
    monkeypatch.setenv("TF_CONFIG", tf_config)
    monkeypatch.delenv("TPU_NAME", raising=False)
    with pytest.raises(ValueError) as raised:
        kzoo.training.get_strategy(name)
    assert str(raised.value).startswith("TF_CONFIG must be a JSON object such as")
    assert message in str(raised.value) and repr(tf_config) in str(raised.value)


def test_auto_and_cpu_on_a_cpu_machine(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TPU_NAME", raising=False)
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    assert kzoo.training.get_strategy("auto") is tf.distribute.get_strategy()
    assert isinstance(kzoo.training.get_strategy("cpu"), tf.distribute.OneDeviceStrategy)


def test_configure_sets_the_dtype_policy_and_passes_jit_compile():
    config = kzoo.training.configure("cpu", mixed_precision=True, jit_compile=False)
    assert config.dtype_policy == "mixed_bfloat16"  # bfloat16 on CPUs, float16 on GPUs only
    assert keras.config.dtype_policy().name == "mixed_bfloat16"
    assert config.jit_compile is False
    assert kzoo.training.configure("cpu").dtype_policy == keras.config.dtype_policy().name == "float32"


def test_configure_rejects_bad_options():
    with pytest.raises(ValueError, match="Unknown `mixed_precision` 'float16'"):
        kzoo.training.configure("cpu", mixed_precision="float16")
    with pytest.raises(ValueError, match="`jit_compile` must be"):
        kzoo.training.configure("cpu", jit_compile="xla")


def test_mixed_float16_compile_scales_the_loss():
    config = kzoo.training.configure("cpu", mixed_precision="mixed_float16")
    with config.strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile("sgd", "mse", jit_compile=config.jit_compile)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


def test_global_batch_must_split_evenly_over_replicas():
    config = kzoo.training.configure("cpu")
    assert config.per_replica_batch_size(8) == 8
    two_replicas = kzoo.training.TrainingConfig(strategy=_two_replicas(), dtype_policy="float32", jit_compile="auto")
    assert two_replicas.per_replica_batch_size(8) == 4
    with pytest.raises(ValueError, match="7 does not split evenly over 2 replicas"):
        two_replicas.per_replica_batch_size(7)


def _two_replicas():
    class TwoReplicas:
        num_replicas_in_sync = 2

    return TwoReplicas()
