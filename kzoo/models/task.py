import importlib
import re
import warnings

import keras
import numpy as np

from kzoo._compat import MultiWorkerTrainerMixin
from kzoo._compat import OptimizerBuiltBeforeTracing
from kzoo.checkpoints.hf import save as hf_save
from kzoo.models import presets
from kzoo.models.backbone import add_quantization_config
from kzoo.models.backbone import check_functional_arguments
from kzoo.models.backbone import from_constructor_config
from kzoo.models.backbone import frozen_heap
from kzoo.models.cross_entropy import TokenCrossEntropy
from kzoo.models.generation import check_token_ids
from kzoo.validation import is_text


def warmup_then_decay(learning_rate, warmup_steps=0, decay_steps=None):
    """The learning rate: linear warmup from 0, then cosine decay to 0.

    Keras' `CosineDecay` with `warmup_target` is exactly this schedule (and
    serializes), so kzoo has no schedule class of its own. Without
    `decay_steps` the rate stays at `learning_rate` after the warmup
    (`alpha=1.0` makes the cosine term vanish).

    Args:
        learning_rate: float, the peak rate, reached after `warmup_steps`.
        warmup_steps: int >= 0.
        decay_steps: int > 0, the steps after the warmup over which the rate
            falls to 0; None to keep it constant.
    """
    if warmup_steps == 0 and decay_steps is None:
        return learning_rate
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        decay_steps=decay_steps or 1,
        alpha=0.0 if decay_steps else 1.0,
        warmup_target=learning_rate,
        warmup_steps=warmup_steps,
    )


# Variables (by name) the default AdamW leaves out of its weight decay.
NO_WEIGHT_DECAY = ("bias", "gamma", "beta")


@keras.saving.register_keras_serializable(package="kzoo")
class Task(OptimizerBuiltBeforeTracing, MultiWorkerTrainerMixin, keras.Model):
    """Base class of kzoo task models: a backbone plus a head, with training defaults.

    A task is a functional `keras.Model` built in its subclass's `__init__`
    from `backbone` (a `kzoo.models.Backbone`) and a head whose output is
    float32 logits, also under a mixed precision policy. `compile()` with no
    arguments sets what training the task usually needs: AdamW with a linear
    warmup and cosine decay, cross-entropy from logits and accuracy (plus
    perplexity for language models).

    Padding: the loss and the default metrics are weighted, so padded or
    unlabelled positions are excluded by giving them sample weight 0, i.e.
    `model.fit(x, y, sample_weight=padding_mask)` or a dataset of
    `(x, y, sample_weight)`.

    Text: a task may carry its `tokenizer` (a keras-hub tokenizer or kzoo's; a
    subclass passes `tokenizer=` through its `**kwargs`), as a keras-hub task
    carries its preprocessor. `.keras` files keep it, vocabulary included, and
    `from_preset` on a Hugging Face folder gives the folder's. With one,
    `preprocess(texts)` gives the model inputs of raw strings, `predict`
    takes strings (a classifier then returns labels) and `generate` returns
    text; token ids in and out work as without.

    Subclasses set `backbone_cls` (the backbone class their presets build),
    may override `default_learning_rate`, `default_metrics` and
    `predictions_from_outputs`, and extend `get_config` with their own
    constructor arguments.

    Example:
    >>> model = kzoo.models.BertClassifier.from_preset("bert_tiny", num_classes=2)
    >>> model.compile(learning_rate=1e-4, warmup_steps=100, decay_steps=1000)
    """

    backbone_cls = None
    default_learning_rate = 5e-4

    def __init__(self, *args, tokenizer=None, **kwargs):
        # `dtype` too: the backbone's policy, which the task takes below.
        check_functional_arguments(self, {name: value for name, value in kwargs.items() if name != "dtype"})
        super().__init__(*args, **kwargs)
        # Functional models take no `dtype`: a task takes its backbone's
        # policy, which also tells `compile` to scale the loss under
        # "mixed_float16" when only the backbone was given that dtype.
        backbone = getattr(self, "backbone", None)
        if backbone is not None:
            self.dtype_policy = backbone.dtype_policy
        if tokenizer is not None:
            _check_tokenizer(tokenizer, backbone)
        self.tokenizer = tokenizer

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """Builds the task on `backbone_cls.from_preset(preset)`; `kwargs` go
        to the task's constructor (e.g. `num_classes`).

        From a Hugging Face folder or a GGUF file the task also gets the checkpoint's
        tokenizer: BERT's and GPT-2's need keras-hub and TensorFlow, the Llama lineage's
        (`HFTokenizer`) neither; `tokenizer=None` loads the weights alone (the model then takes
        token ids).
        """
        return presets.from_preset(cls, preset, **kwargs)

    def default_metrics(self):
        """Metrics `compile()` uses when none are given (weighted by sample weights)."""
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    def compile(
        self,
        optimizer="auto",
        loss="auto",
        *,
        weighted_metrics="auto",
        learning_rate=None,
        warmup_steps=0,
        decay_steps=None,
        weight_decay=0.01,
        **kwargs,
    ):
        """Configures training; any argument given replaces its default.

        Args:
            optimizer: "auto" for AdamW on `warmup_then_decay(learning_rate,
                warmup_steps, decay_steps)` with `weight_decay`, global gradient
                norm clipping at 1.0, and no decay of biases and LayerNorm
                parameters; or any `keras.Model.compile` optimizer.
            loss: "auto" for `TokenCrossEntropy()`: the sparse softmax
                cross-entropy from logits, averaged over the positions with
                non-zero sample weight.
            weighted_metrics: "auto" for `default_metrics()`.
            learning_rate: float, the peak rate; defaults to
                `default_learning_rate`.
            warmup_steps: int, steps of linear warmup from 0.
            decay_steps: int or None, steps of cosine decay after the warmup;
                None keeps the rate constant.
            weight_decay: float, AdamW's decoupled weight decay.
            **kwargs: other `keras.Model.compile` arguments.
        """
        # Keras does not serialize a decay exclusion; `get_compile_config` keeps kzoo's.
        self._no_weight_decay = None
        if optimizer == "auto":
            optimizer = keras.optimizers.AdamW(
                learning_rate=warmup_then_decay(
                    self.default_learning_rate if learning_rate is None else learning_rate,
                    warmup_steps,
                    decay_steps,
                ),
                weight_decay=weight_decay,
                global_clipnorm=1.0,
            )
            # Decay pulls weights towards 0, which is wrong for a scale
            # (gamma) and pointless for shifts (beta, biases).
            optimizer.exclude_from_weight_decay(var_names=NO_WEIGHT_DECAY)
            self._no_weight_decay = NO_WEIGHT_DECAY
        if loss == "auto":
            # The mean over weighted tokens: padding neither counts nor dilutes.
            loss = TokenCrossEntropy()
        if weighted_metrics == "auto":
            weighted_metrics = self.default_metrics()
        super().compile(optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics, **kwargs)

    def get_compile_config(self):
        config = super().get_compile_config()
        if config is not None and getattr(self, "_no_weight_decay", None):
            config["no_weight_decay"] = list(self._no_weight_decay)
        return config

    def compile_from_config(self, config):
        """Restores the compile state a `.keras` file saved: the stored optimizer
        (its variables are then loaded too, so training continues where it was)
        with the variables it leaves undecayed, loss and metrics, not the
        defaults. Keras skips this for a subclass that overrides `compile`
        unless the subclass defines it."""
        config = dict(config)
        no_weight_decay = config.pop("no_weight_decay", None)
        self.compile(**keras.saving.deserialize_keras_object(config))
        if no_weight_decay:
            self.optimizer.exclude_from_weight_decay(var_names=no_weight_decay)
            self._no_weight_decay = no_weight_decay
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def fit(self, x=None, *args, **kwargs):
        self._check_host_inputs(x, "fit")
        return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        self._check_host_inputs(x, "evaluate")
        return super().evaluate(x, *args, **kwargs)

    def _check_host_inputs(self, x, method):
        """Checks the NumPy arrays (or lists) of `x` named `*token_ids`, or `x` itself when it is
        not a dict; leaves datasets and tensors."""
        features = x if isinstance(x, dict) else {"x": x}
        vocabulary_size = getattr(getattr(self, "backbone", None), "vocabulary_size", None) or getattr(
            self, "vocabulary_size", None
        )
        for name, value in features.items():
            if (features is x and not name.endswith("token_ids")) or not isinstance(value, (np.ndarray, list)):
                continue
            value = np.asarray(value)
            if value.dtype.kind not in "iuf" and value.size:  # None, objects: neither ids nor text
                item = value.reshape(-1)[0]
                raise ValueError(
                    f"`{name}` must hold integer token ids"
                    + (" (or be strings: the model has a tokenizer)" if self.tokenizer is not None else "")
                    + f"; received {item!r} ({type(item).__name__})."
                )
            if value.ndim == 0 or value.shape[0] == 0:
                raise ValueError(
                    f"`{name}` has no rows: {method} needs at least one example; received shape {value.shape}."
                )
            if vocabulary_size is not None:
                check_token_ids(value, vocabulary_size, name)

    def preprocess(self, texts):
        """The model inputs of raw strings, tokenized with `tokenizer` and packed as the
        backbone reads them (BERT: `[CLS] tokens [SEP]`), cut to its maximum length.

        Args:
            texts: a string or a list / 1-D tensor of strings.

        Returns:
            A dict of int32 tensors `(B, T)`, T the longest row.
        """
        from kzoo.tokenizers import packing  # TensorFlow ops

        if self.tokenizer is None:
            raise ValueError(f"This {type(self).__name__} has no tokenizer; pass `tokenizer=` or give token ids.")
        packing.check_text(texts, "texts")
        return packing.pack(self.backbone, self.tokenizer, texts)

    def predictions_from_outputs(self, outputs):
        """What `predict` returns for raw strings, from the model's outputs (the outputs
        themselves; a classifier overrides it to return labels)."""
        return outputs

    def predict(self, x, *args, **kwargs):
        """`keras.Model.predict`; raw strings (a list of them, or one) are first
        tokenized with `preprocess` and the result goes through
        `predictions_from_outputs` (a classifier gives labels). NumPy token ids are
        checked first (also in `fit` and `evaluate`): they must be integers in the
        vocabulary, and there must be rows. Out of the vocabulary, compiled code (XLA)
        would give NaN rows rather than an error."""
        if not is_text(x):
            self._check_host_inputs(x, "predict")
            return super().predict(x, *args, **kwargs)
        from kzoo.tokenizers import packing  # TensorFlow ops: only for text

        packing.check_text(x, "x")
        outputs = super().predict({k: v.numpy() for k, v in self.preprocess(x).items()}, *args, **kwargs)
        return self.predictions_from_outputs(outputs)

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """`keras.Model.quantize` (e.g. `"int8"`) on every layer but the tokenizer.

        The tokenizer holds a vocabulary, not weights: Keras would try to quantize it
        (it is a layer) and stop, since it is never built. `filters` keeps Keras' meaning
        (a regex on layer names, a list of them, or a callable).
        """
        if self.tokenizer is not None:
            filters = _excluding(self.tokenizer, filters)
        with warnings.catch_warnings():
            # Keras warns for each layer it leaves as it is: norms, positions and blocks, which hold
            # no matrix of their own, are no problem of the user's.
            warnings.filterwarnings("ignore", message=r"Layer \w+ does not have a `quantize` method implemented")
            with frozen_heap():
                super().quantize(mode, config=config, filters=filters, **kwargs)

    def export_to_transformers(self, path):
        """Writes the task as a Hugging Face folder (`config.json`, `model.safetensors` and
        its tokenizer's files) that `transformers`' `AutoModelFor*.from_pretrained(path)`
        loads: BERT tasks as `BertForMaskedLM`, `BertForSequenceClassification` and
        `BertForTokenClassification`, `GPTCausalLM` as `GPT2LMHeadModel`.

        Args:
            path: a new (or empty) folder.

        Example:
        >>> import os
        >>> classifier = kzoo.models.BertClassifier.from_preset("bert_tiny", num_classes=2)
        >>> classifier.export_to_transformers("bert_classifier")  # AutoModelForSequenceClassification
        >>> sorted(os.listdir("bert_classifier"))
        ['config.json', 'model.safetensors']
        """
        hf_save.export_to_transformers(self, path)

    def get_config(self):
        # Not chained to keras.Model: a task is rebuilt from its constructor
        # arguments, the backbone first.
        config = {"backbone": keras.layers.serialize(self.backbone), "name": self.name}
        if self.tokenizer is not None:
            config["tokenizer"] = keras.layers.serialize(self.tokenizer)
        return add_quantization_config(config, self)

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("backbone"), dict):
            config["backbone"] = keras.layers.deserialize(config["backbone"])
        if isinstance(config.get("tokenizer"), dict):
            # Registers kzoo's tokenizer class of the file only when needed, so that a file
            # reloads with `import kzoo` alone; BERT's and the character tokenizer import keras-hub
            # and TensorFlow, the Llama lineage's `HFTokenizer` neither.
            for module in _TOKENIZER_MODULES.get(config["tokenizer"].get("registered_name"), _ALL_TOKENIZER_MODULES):
                importlib.import_module(module)
            # The vocabulary comes after, from the file's assets (`load_assets`).
            config["tokenizer"] = keras.layers.deserialize(config["tokenizer"])
        return from_constructor_config(cls, config)


# The module that registers each kzoo tokenizer class, by its name in a `.keras` file; a file with
# another tokenizer (keras-hub's own) gets them all, keras-hub among them.
_TOKENIZER_MODULES = {
    "kzoo>HFTokenizer": ("kzoo.tokenizers.hugging_face",),
    "kzoo>BertTokenizer": ("kzoo.tokenizers.bert",),
    "kzoo>CharacterTokenizer": ("kzoo.tokenizers.characters",),
}
_ALL_TOKENIZER_MODULES = tuple(module for (module,) in _TOKENIZER_MODULES.values())


def _excluding(excluded, filters):
    """`keras.Model.quantize`'s `filters` as a callable that also leaves out the layer `excluded`."""
    if filters is None or callable(filters):
        chosen = filters or (lambda layer: True)
    else:
        patterns = [filters] if isinstance(filters, str) else list(filters)

        def chosen(layer):
            return any(re.search(pattern, layer.name) for pattern in patterns)

    return lambda layer: layer is not excluded and chosen(layer)


def _check_tokenizer(tokenizer, backbone):
    """A tokenizer whose ids the backbone can embed (not yet checkable while loading)."""
    if not callable(getattr(tokenizer, "tokenize", None)) or not callable(getattr(tokenizer, "detokenize", None)):
        raise ValueError(
            f"`tokenizer` must be a tokenizer (with `tokenize` and `detokenize`); received {type(tokenizer).__name__}."
        )
    try:
        size = int(tokenizer.vocabulary_size())
    except (ValueError, TypeError, AttributeError):  # no vocabulary yet: a `.keras` file sets it after
        return
    limit = getattr(backbone, "vocabulary_size", None)
    if limit is not None and size > limit:
        raise ValueError(
            f"The tokenizer has {size} tokens but the backbone embeds {limit}: its ids would not fit. "
            "Give a tokenizer of the backbone's vocabulary."
        )


@keras.saving.register_keras_serializable(package="kzoo")
class StandaloneTask(Task):
    """Base class of the task models built from layers without a backbone (the RNN and n-gram baselines).

    The subclass builds its functional model in `__init__` and passes it
    `inputs`, `outputs` and `dtype`; this base sets the dtype policy (a
    functional model takes none) and rebuilds the model from the subclass's
    constructor arguments, which the subclass adds in `get_config`.

    Args:
        dtype: None or a dtype policy; it also tells `compile` to scale the
            loss under "mixed_float16".
        **kwargs: `keras.Model` functional arguments (`inputs`, `outputs`,
            `name`).
    """

    def __init__(self, *args, dtype=None, **kwargs):
        super().__init__(*args, **kwargs)
        if dtype is not None:
            self.dtype_policy = keras.dtype_policies.get(dtype)

    def get_config(self):
        config = {"name": self.name, "dtype": keras.dtype_policies.serialize(self.dtype_policy)}
        return add_quantization_config(config, self)

    @classmethod
    def from_config(cls, config):
        return from_constructor_config(cls, config)
