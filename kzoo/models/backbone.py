import contextlib
import gc
import math

import keras

from kzoo import _compat
from kzoo.checkpoints.hf import save as hf_save
from kzoo.models import presets
from kzoo.validation import check_positive_int


@keras.saving.register_keras_serializable(package="kzoo")
class Backbone(keras.Model):
    """Base class of kzoo backbones: the network without a task head.

    A backbone is a functional `keras.Model` built in its subclass's
    `__init__` (so `summary()` lists its layers) that maps a dict of token
    inputs to hidden states. Tasks (`kzoo.models.Task`) wrap one and add a
    head. Subclasses store every constructor argument as an attribute and
    return them from `get_config`; this base adds `name`, `trainable` and
    `dtype`, and `from_config` calls the constructor, so a `.keras` file gives
    back the subclass rather than a plain `keras.Model`.

    Subclasses that can import keras-hub weights set `keras_hub_class_name`
    (e.g. "BertBackbone") and implement the classmethod
    `from_keras_hub(hub_backbone, **kwargs)`.

    Args:
        dtype: None (the global policy), a dtype policy name such as
            "mixed_bfloat16", or a `keras.DTypePolicy`. Subclasses pass the
            same value to each of their layers.
        **kwargs: `keras.Model` functional arguments (`inputs`, `outputs`,
            `name`, `trainable`).

    Example:
    >>> backbone = kzoo.models.GPTBackbone.from_preset("gpt_tiny")
    >>> backbone.count_params()
    462336
    """

    keras_hub_class_name = None

    def __init__(self, *args, dtype=None, **kwargs):
        check_functional_arguments(self, kwargs)
        super().__init__(*args, **kwargs)
        # Functional models take no `dtype`; the policy is set afterwards so
        # that `get_config` reports the one the layers were built with.
        if dtype is not None:
            self.dtype_policy = keras.dtype_policies.get(dtype)

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """Builds the backbone from a preset name (random weights), a local
        Hugging Face folder or a keras-hub preset directory (converted
        weights); `kwargs` override the preset's config. See
        `kzoo.models.list_presets` and `kzoo.checkpoints.hf.load`."""
        return presets.from_preset(cls, preset, **kwargs)

    def export_to_transformers(self, path):
        """Writes the backbone as a Hugging Face folder (`config.json` and
        `model.safetensors`, e.g. as `BertModel`, `GPT2Model` or `LlamaModel`) that
        `transformers.AutoModel.from_pretrained(path)` loads.

        Args:
            path: a new (or empty) folder.

        Example:
        >>> kzoo.models.DecoderBackbone.from_preset("llama_tiny").export_to_transformers("llama_tiny_hf")
        >>> import json
        >>> json.load(open("llama_tiny_hf/config.json"))["architectures"]  # AutoModel.from_pretrained("llama_tiny_hf")
        ['LlamaModel']
        """
        hf_save.export_to_transformers(self, path)

    def enable_lora(self, rank, target_layer_names=None):
        """Freezes the backbone and adds LoRA to its attention's query and value projections.

        Keras' layer LoRA (`layer.enable_lora(rank)`) on every layer named in
        `target_layer_names`: each kernel W gets a trainable low-rank update
        W + A B, A `(d, rank)` and B `(rank, d')` (B starts at zero, so the
        model's outputs do not change until it trains). Every other backbone
        weight is frozen; a task's head stays trainable. A saved model stores
        the merged kernels W + A B. As keras-hub's `Backbone.enable_lora`,
        except that the adapted layers' biases stay frozen too.

        Args:
            rank: int, the rank of the update, in [1, `max_lora_rank(...)`].
            target_layer_names: the names of the layers to adapt; by default
                the query and value projections of every attention
                ("query", "value"), as in the LoRA paper.

        Returns:
            The adapted layers.

        Raises:
            ValueError: for a rank out of its range (checked before any
                weight is made), or names that match no layer.

        Example:
        >>> lm = kzoo.models.GPTCausalLM.from_preset("gpt_tiny")
        >>> sorted({layer.name for layer in lm.backbone.enable_lora(4)})
        ['query', 'value']
        >>> lm.compile(learning_rate=1e-3)  # trains the LoRA weights only

        References:
            Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", 2021.
        """
        check_positive_int("rank", rank)
        limit = self.max_lora_rank(target_layer_names)
        if rank > limit:
            # Checked before any weight is made: a huge rank would exhaust the memory first.
            raise ValueError(
                f"`rank` must be in [1, {limit}] (the smallest dimension of the adapted kernels: a larger "
                f"update A B is no richer); received rank={rank}."
            )
        adapted = self._lora_layers(target_layer_names)
        layers = _compat.sublayers(self)
        self.trainable = True
        for layer in layers:
            layer.trainable = False
        for layer in adapted:
            layer.trainable = True
            layer.enable_lora(rank)  # freezes the kernel
            if getattr(layer, "bias", None) is not None:
                layer.bias.trainable = False  # LoRA adapts the kernels only
        return adapted

    def max_lora_rank(self, target_layer_names=None):
        """The largest rank `enable_lora` takes for these layers: the smallest dimension of their
        kernels, each as the matrix its update A B stands for (inputs by outputs). A larger
        rank adds parameters (and memory) and no expressiveness.

        Args:
            target_layer_names: as `enable_lora`'s.

        Raises:
            ValueError: when no layer of the backbone has one of the names.

        Example:
        >>> kzoo.models.GPTBackbone.from_preset("gpt_tiny").max_lora_rank()  # a head's width
        32
        """
        return min(min(_lora_dimensions(layer)) for layer in self._lora_layers(target_layer_names))

    def _lora_layers(self, target_layer_names):
        names = ("query", "value") if target_layer_names is None else tuple(target_layer_names)
        layers = _compat.sublayers(self)
        adapted = [layer for layer in layers if layer.name in names and hasattr(layer, "enable_lora")]
        if not adapted:
            raise ValueError(f"No layer of this backbone is named one of `target_layer_names` {list(names)}.")
        return adapted

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """`keras.Model.quantize`, with the heap frozen meanwhile (see `frozen_heap`)."""
        with frozen_heap():
            super().quantize(mode, config=config, filters=filters, **kwargs)

    def get_config(self):
        # Not chained to keras.Model: a functional config is a layer graph,
        # while a backbone is rebuilt from its constructor arguments.
        config = {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
        }
        return add_quantization_config(config, self)

    @classmethod
    def from_config(cls, config):
        return from_constructor_config(cls, config)


# `model.quantize(mode)` replaces the float kernels of its Dense, EinsumDense
# and Embedding layers; a config records which layers it quantized (by path),
# so that `from_constructor_config` quantizes the rebuilt ones before their weights load.


def _lora_dimensions(layer):
    """The (inputs, outputs) of the matrix that a layer's LoRA update A B stands for: Keras gives
    A the kernel's shape but its last axis, and B its last axis."""
    shape = tuple(layer.kernel.shape)
    if layer.quantization_mode == "int4":  # the kernel is packed; the layer keeps its own shape
        packed = getattr(layer, "original_kernel_shape", None)
        shape = tuple(packed or (_compat.int4_kernel_input_dim(layer), *shape[1:]))
    return math.prod(shape[:-1]), shape[-1]


def add_quantization_config(config, model):
    """`config` plus {"quantized_layers": {path: mode}} when `model` has quantized layers."""
    quantized = {
        layer.path: layer.quantization_mode for layer in _compat.sublayers(model) if layer.quantization_mode is not None
    }
    return {**config, "quantized_layers": quantized} if quantized else config


FUNCTIONAL_ARGUMENTS = ("inputs", "outputs", "name", "trainable")


def check_functional_arguments(model, kwargs):
    """Refuses the arguments among `kwargs` that a subclass's constructor passed on to
    `keras.Model` but that are not its functional arguments: Keras drops them silently, so a
    misspelt `from_preset(..., num_clases=3)` would build the default model without a word."""
    unknown = sorted(set(kwargs) - set(FUNCTIONAL_ARGUMENTS))
    if unknown:
        raise TypeError(
            f"{type(model).__name__} got unexpected arguments {unknown}: it takes its own constructor's "
            f"arguments, `dtype` and {list(FUNCTIONAL_ARGUMENTS)}."
        )


def from_constructor_config(cls, config):
    """`cls(**config)` with its dtype policy deserialized and its quantized layers quantized again."""
    config = dict(config)
    quantized = config.pop("quantized_layers", {})
    if isinstance(config.get("dtype"), dict):
        config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
    model = cls(**config)
    if quantized:
        with frozen_heap():
            for layer in _compat.sublayers(model):
                if layer.path in quantized and layer.quantization_mode is None:
                    layer.quantize(quantized[layer.path])
    return model


@contextlib.contextmanager
def frozen_heap():
    """Keras collects garbage each time a layer drops a variable (`Layer.__delattr__`), so once
    for every kernel that quantizing replaces, and a full collection walks every object the
    process tracks (half a million once TensorFlow is imported): a minute for a model of a few
    hundred kernels. Inside, the objects that existed on entry are frozen (`gc.freeze`) and those
    collections walk only the new ones; on exit they are unfrozen and collected once, which frees
    the replaced kernels. A process that froze objects itself keeps its state: then nothing is
    done."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()
