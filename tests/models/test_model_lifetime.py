"""A model the caller drops is freed with its weights, whatever kzoo traced for it: `generate`'s
cache of compiled loops and TensorFlow's registry of custom gradients (`tf.nn.silu`'s) held
them for the life of the process, so an export could not free a loaded model before its
LiteRT checks (`kzoo.export.exporter`)."""

import weakref

import keras
import pytest

import kzoo
from kzoo.export import memory
from kzoo.models.decoder import speculative


def weight_handles(model):
    """Weak references to the TensorFlow handles of the model's weights: what a traced function
    captures, and what keeps a weight's buffer alive."""
    return [weakref.ref(variable.value.handle) for variable in model.weights]


@pytest.mark.parametrize("draft", [None, "model", "lookup"], ids=["generate", "speculative", "prompt_lookup"])
def test_a_dropped_model_frees_its_weights_after_generating(draft):
    keras.utils.set_random_seed(0)
    target = kzoo.models.CausalLM(kzoo.models.DecoderBackbone.from_preset("llama_tiny", num_layers=1))  # SiLU
    handles = weight_handles(target)
    if draft == "model":
        drafter = kzoo.models.CausalLM(kzoo.models.DecoderBackbone.from_preset("llama_tiny", num_layers=1))
        handles += weight_handles(drafter)
        speculative.generate(target, [[7, 3]], draft_model=drafter, max_length=8, jit_compile=False)
        del drafter
    elif draft == "lookup":  # its loops are kept per target, beside the lookup's settings
        speculative.generate(target, [[7, 3]], draft_model=kzoo.models.PromptLookup(), max_length=8, jit_compile=False)
    else:
        target.generate([[7, 3]], max_length=8, jit_compile=False)
    models = weakref.ref(target)
    del target
    memory.release_freed_memory()
    assert models() is None
    assert sum(handle() is not None for handle in handles) == 0


def test_silu_is_keras_silu():
    x = keras.random.normal((3, 50), seed=1) * 6
    assert keras.ops.convert_to_numpy(kzoo.ops.get_activation("silu")(x)).tolist() == (
        keras.ops.convert_to_numpy(keras.activations.silu(x)).tolist()
    )
