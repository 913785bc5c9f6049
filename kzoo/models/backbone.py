import keras

from kzoo.models import hf_checkpoint
from kzoo.models import presets


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
    >>> backbone.summary()
    """

    keras_hub_class_name = None

    def __init__(self, *args, dtype=None, **kwargs):
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
        `kzoo.models.list_presets` and `kzoo.models.hf_checkpoint`."""
        return presets.from_preset(cls, preset, **kwargs)

    def export_to_transformers(self, path):
        """Writes the backbone as a Hugging Face folder (`config.json` and
        `model.safetensors`, e.g. as `BertModel` or `GPT2Model`) that
        `transformers.AutoModel.from_pretrained(path)` loads.

        Args:
            path: a new (or empty) folder.

        Example:
        >>> backbone = kzoo.models.BertBackbone.from_preset("path/to/bert-folder")
        >>> backbone.export_to_transformers("out/")  # transformers.AutoModel.from_pretrained("out/")
        """
        hf_checkpoint.export_to_transformers(self, path)

    def get_config(self):
        # Not chained to keras.Model: a functional config is a layer graph,
        # while a backbone is rebuilt from its constructor arguments.
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)
