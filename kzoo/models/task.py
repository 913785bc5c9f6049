import keras

from kzoo.models import presets
from kzoo.models.backbone import add_quantization_config
from kzoo.models.backbone import from_constructor_config
from kzoo.models.cross_entropy import TokenCrossEntropy
from kzoo.models.multi_worker_trainer_mixin import MultiWorkerTrainerMixin


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
class Task(MultiWorkerTrainerMixin, keras.Model):
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

    Subclasses set `backbone_cls` (the backbone class their presets build),
    may override `default_learning_rate` and `default_metrics`, and extend
    `get_config` with their own constructor arguments.

    Example:
    >>> model = kzoo.models.BertClassifier.from_preset("bert_tiny", num_classes=2)
    >>> model.compile(learning_rate=1e-4, warmup_steps=100, decay_steps=1000)
    """

    backbone_cls = None
    default_learning_rate = 5e-4

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Functional models take no `dtype`: a task takes its backbone's
        # policy, which also tells `compile` to scale the loss under
        # "mixed_float16" when only the backbone was given that dtype.
        backbone = getattr(self, "backbone", None)
        if backbone is not None:
            self.dtype_policy = backbone.dtype_policy

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """Builds the task on `backbone_cls.from_preset(preset)`; `kwargs` go
        to the task's constructor (e.g. `num_classes`)."""
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

    def get_config(self):
        # Not chained to keras.Model: a task is rebuilt from its constructor
        # arguments, the backbone first.
        return add_quantization_config({"backbone": keras.layers.serialize(self.backbone), "name": self.name}, self)

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("backbone"), dict):
            config["backbone"] = keras.layers.deserialize(config["backbone"])
        return from_constructor_config(cls, config)


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
