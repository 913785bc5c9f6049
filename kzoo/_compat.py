"""Every use of another library's private API, one named function (or hook class) each.

The rule: kzoo reaches into no other library's private parts (`keras.src`, `keras_hub.src`, an
`_attribute` or `_method` of an object it did not make, an override of another library's
`_method`) anywhere but here. Each entry says what public API is missing, the upstream issue
(or that none is filed), and when to remove it. A private API may change in any release, so:
- `pyproject.toml` bounds each library used here below its next untested minor release;
- `tests/test_compat.py` calls every entry on a tiny object (an upgrade that breaks one fails
  there first, naming it) and fails on a private use anywhere else in kzoo/, recipes/ or export/.

This module sits below every other kzoo module: it imports only the libraries it wraps, each
(but Keras) where it is used, so that importing it costs nothing more than `import keras`.

Checked against keras 3.15.1, keras-hub 0.32.0, tensorflow 2.21.0, tensorflow-datasets 4.9.10.
"""

import contextlib
import sys

import keras
from keras import tree

# Keras


def sublayers(layer):
    """Every layer nested in `layer` (not itself), each once, in Keras' own order.

    Missing publicly: a recursive walk over a layer's sublayers (`Model.layers` lists the direct
    children of a functional model only, and a plain `Layer` has no `layers`). Keras' own
    `Layer._flatten_layers` is what `quantize`, `enable_lora` and saving walk, so kzoo walks the
    same layers in the same order. No upstream issue filed (keras-team/keras#4398, "Ability to
    flatten nested models", asked it of Keras 2 and closed as stale).
    Remove when Keras exposes a recursive sublayer walk.
    """
    return layer._flatten_layers(include_self=False)


def keras_mask(x):
    """The implicit Keras mask that a layer attached to tensor `x`, or None.

    Missing publicly: a getter for the mask Keras propagates between layers (`compute_mask`
    sets it; `keras.src.backend.get_keras_mask` reads it, as keras-hub's layers and Keras' own do,
    e.g. keras-team/keras#23268). No upstream issue filed.
    Remove when Keras exports `get_keras_mask` (e.g. as `keras.backend.get_keras_mask`).
    """
    from keras.src.backend import get_keras_mask

    return get_keras_mask(x)


def int4_kernel_input_dim(layer):
    """The unpacked input dimension of an int4-quantized `Dense` (its kernel packs two rows a byte).

    Missing publicly: the shape a packed kernel stands for (`EinsumDense` keeps it public as
    `original_kernel_shape`; `Dense` keeps it as `_orig_input_dim`). No upstream issue filed.
    Remove when `Dense` exposes its unpacked kernel shape.
    """
    return layer._orig_input_dim


@contextlib.contextmanager
def forgotten_uninitialized_variables():
    """Within it, variables made in `keras.StatelessScope(initialize_variables=False)` are
    dropped from Keras' queue of variables to initialize at the next scope's exit.

    Missing publicly: a way to build a model only for its variables' shapes without Keras
    allocating them later (Keras queues them in the global attribute "uninitialized_variables").
    No upstream issue filed.
    Remove when `StatelessScope` (or another public scope) builds shapes without queueing them.
    """
    from keras.src.backend.common import global_state

    registry = "uninitialized_variables"
    before = list(global_state.get_global_attribute(registry, [], set_to_default=True))
    try:
        yield
    finally:
        global_state.set_global_attribute(registry, before)


@contextlib.contextmanager
def deferred_variables():
    """Within it, new Keras variables get their shapes but no values (no memory, no initializer
    run); yields a list that holds them once the block ends. Give each its value with
    `set_variable` (or its own initializer with `set_variable(variable, None)`).

    Missing publicly: building a model whose variables take their first values from a file,
    without computing random ones first (`StatelessScope(initialize_variables=False)` defers them,
    but only Keras' private `_deferred_initialize` gives them values, and only from their own
    initializer). No upstream issue filed.
    Remove when Keras offers a public deferred build (or initializing a variable from a value).
    """
    from keras.src.backend.common import global_state

    registry = "uninitialized_variables"
    before = list(global_state.get_global_attribute(registry, [], set_to_default=True))
    global_state.set_global_attribute(registry, [])
    made = []
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield made
    finally:
        made.extend(global_state.get_global_attribute(registry, []))
        global_state.set_global_attribute(registry, before)


def set_variable(variable, value):
    """Gives `variable` the array `value`: its first value when it was made in `deferred_variables`
    (None: the one its own initializer draws), else an assignment. See `deferred_variables`."""
    if getattr(variable, "_value", True) is not None:
        if value is not None:
            variable.assign(value)
        return
    if value is not None and keras.distribution.distribution() is not None:
        # Under a distribution (JAX) Keras shards a new variable by jitting its initializer,
        # which fails on a lambda's `__call__` (no weak reference) and would make `value` a
        # constant of a program. `_initialize` shards the value itself (`distribute_tensor`).
        variable._initializer = None
        variable._initialize(variable._convert_to_tensor(value))
        return
    if value is not None:
        variable._initializer = lambda shape, dtype: value
    variable._deferred_initialize()


def print_msg(message):
    """Prints `message` as Keras' callbacks print theirs: to stdout when Keras' interactive
    logging is on, else to absl's log.

    Missing publicly: Keras' `io_utils.print_msg` (`keras.utils` exports no printer that follows
    `keras.config.disable_interactive_logging`). No upstream issue filed.
    Remove with `ModelCheckpoint` below, or when Keras exports a printer.
    """
    from keras.src.utils import io_utils

    io_utils.print_msg(message)


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keras' `ModelCheckpoint` whose file writing a subclass may take over: `writes(filepath)`
    says whether it does, `write(filepath)` writes. The choice of path and of when to save (the
    `save_best_only` bookkeeping) and the message stay Keras'.

    Missing publicly: a hook for how `ModelCheckpoint` writes its file; this overrides the private
    `_save_model` and calls the private `_get_file_path` and `_should_save_model`. No upstream
    issue filed (a truncated checkpoint after a kill or a full disk is the reason kzoo writes its
    own).
    Remove when Keras' `ModelCheckpoint` writes atomically or takes a writer.
    """

    def writes(self, filepath):
        """Whether `write` writes `filepath` (else Keras does). Keras writes every path here."""
        return False

    def write(self, filepath):
        """Writes the model (or its weights, `save_weights_only`) to `filepath`."""
        raise NotImplementedError

    def _save_model(self, epoch, batch, logs):
        filepath = self._get_file_path(epoch, batch, logs)
        if not self.writes(filepath):
            return super()._save_model(epoch, batch, logs)
        if not self._should_save_model(epoch, batch, logs, filepath):
            return None
        self.write(filepath)
        if self.verbose > 0:
            print_msg(f"\nEpoch {epoch + 1}: finished saving model to {filepath}")
        return None


def set_initial_epoch(model, epoch):
    """Makes the `fit` that is starting begin at `epoch` (0-based), as Keras' own
    `BackupAndRestore` does when it resumes; call it from a callback's `on_train_begin`.

    Missing publicly: a way for a callback to move `fit`'s first epoch; this sets the private
    `Model._initial_epoch` that `fit` reads after `on_train_begin`. No upstream issue filed.
    Remove when Keras lets a callback set the initial epoch publicly.
    """
    model._initial_epoch = epoch


def in_multi_worker_mode(strategy):
    """Whether `strategy` is a `MultiWorkerMirroredStrategy` spanning several workers.

    Public API only (TensorFlow's own test is the private `extended._in_multi_worker_mode()`):
    such a strategy keeps `num_replicas_in_sync` = workers x the local `worker_devices`.
    """
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        strategy.num_replicas_in_sync > len(strategy.extended.worker_devices)
    )


class MultiWorkerTrainerMixin:
    """Makes `fit`/`evaluate` work under `MultiWorkerMirroredStrategy` (keras#20585).

    Keras 3's TensorFlow trainer fails on two workers or more with
    "Attempt to convert a value (PerReplica...) to a Tensor", then, once past
    that, with "Invalid reduction dimension 0 for input with 0 dimensions":

    1. `TensorFlowTrainer._maybe_symbolic_build` builds the model from the
       first batch after reducing the whole `(x, y, sample_weight)` structure
       with `strategy.reduce("MEAN", batch, axis=None)`. Only
       `MirroredStrategy` maps `reduce` over a nested structure;
       `CollectiveAllReduceExtended._reduce_to` hands the tuple to
       `CollectiveAllReduce.reduce`, which cannot convert it to a tensor. The
       build needs only shapes and dtypes, so this mixin builds from the first
       local replica's batch: no reduction, and no collective across workers.
    2. `_make_function` reduces the step's logs with `reduce_per_replica(...,
       "auto")`, i.e. `strategy.reduce("MEAN", log, axis=0)` under multiple
       workers, and the logs are scalars. This mixin gives every log a leading
       axis of length 1 in multi-worker mode, so that the same reduction
       averages the logs over all replicas, as "auto" does on one worker.

    Private API: it overrides the trainer's `_maybe_symbolic_build` and `_make_function` and
    reads `_distribute_strategy` (the strategy the model was made under, or None).
    Upstream issue: https://github.com/keras-team/keras/issues/20585.
    Remove this class (and its base in `kzoo.models.Task`) once that issue is fixed: the
    multi-worker test in `tests/training` tells. Checked with Keras 3.15.1.

    Put it before `keras.Model` in the bases: `class Task(MultiWorkerTrainerMixin,
    keras.Model)`. On other backends and strategies it changes nothing.
    """

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        import tensorflow as tf

        if iterator is not None and self._distribute_strategy is not None:
            strategy = self._distribute_strategy
            for _, _, batches in iterator:
                data_batch = tree.map_structure(
                    lambda value: (
                        strategy.experimental_local_results(value)[0]
                        if isinstance(value, tf.distribute.DistributedValues)
                        else value
                    ),
                    next(batches),
                )
                break
        return super()._maybe_symbolic_build(data_batch=data_batch)

    def _make_function(self, step_function, *args, **kwargs):
        # The JAX trainer has a `_make_function` of its own, with more arguments.
        if keras.backend.backend() != "tensorflow" or not in_multi_worker_mode(self.distribute_strategy):
            return super()._make_function(step_function, *args, **kwargs)

        import tensorflow as tf

        def step_with_replica_axis(data):
            return tree.map_structure(lambda log: tf.expand_dims(log, 0), step_function(data))

        return super()._make_function(step_with_replica_axis)


class OptimizerBuiltBeforeTracing:
    """Builds the optimizer before the TensorFlow trainer traces the train step, which is then traced once.

    Without a distribution strategy, Keras 3's `TensorFlowTrainer._maybe_symbolic_build` builds
    nothing ("defer building to when the train/test/predict function gets traced"), so the
    optimizer makes its slot variables inside the first trace of the train step, and a
    `tf.function` that creates variables on its first call is traced a second time: every `fit`
    starts with two traces of the whole train step. Under a strategy the trainer builds the
    optimizer before tracing; this mixin does the same without one.

    Private API: it overrides the trainer's `_maybe_symbolic_build` and reads
    `_distribute_strategy`. No upstream issue filed. Remove it when Keras builds the optimizer
    before tracing (the trace count asserted by the overfit tests in tests/models/test_tasks.py
    tells). Checked with Keras 3.15.1.
    """

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None and self.built and self.optimizer and not self.optimizer.built:
            self.optimizer.build(self.trainable_variables)
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)


def in_xla_context():
    """Whether TensorFlow is tracing a function that it compiles whole with XLA (`jit_compile`).

    Missing publicly: TensorFlow has no public way to ask; its own XLA code asks
    `control_flow_util.GraphOrParentsInXlaContext` (in `tensorflow.python`). No upstream issue
    filed. Remove when TensorFlow exposes it.
    """
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


class _TensorFlowOnceImported:
    """Keras' lazy `tensorflow` module (`keras.src.utils.module_utils.tensorflow`), but
    `available` only once TensorFlow is imported; every other attribute is the lazy module's."""

    def __init__(self, lazy):
        self.lazy = lazy

    @property
    def available(self):
        return sys.modules.get("tensorflow") is not None and self.lazy.available

    def __getattr__(self, name):
        return getattr(self.lazy, name)


def serialize_without_importing_tensorflow():
    """Makes Keras' serialization (`serialize_keras_object`, so every `get_config`) stop
    importing TensorFlow where TensorFlow is installed but not imported; its results are unchanged.

    Keras asks `tf.available` of its lazy `tensorflow` module before it tests an object against
    `tf.TensorShape`, `tf.DType` and `tf.TypeSpec`, and that question imports TensorFlow (3-4 s)
    under any backend. No object of those classes exists before TensorFlow is imported, so the
    answer "not available" until then gives the same configs. This replaces the module global
    `tf` of `keras.src.saving.serialization_lib` with a view of the same lazy module that says so.
    Missing publicly: a way to keep Keras from importing TensorFlow under another backend where
    it is installed (keras-team/keras#18455 asked it of Keras Core's import, closed as stale).
    Remove when Keras' serialization asks only once TensorFlow is imported.
    """
    from keras.src.saving import serialization_lib

    if not isinstance(serialization_lib.tf, _TensorFlowOnceImported):
        serialization_lib.tf = _TensorFlowOnceImported(serialization_lib.tf)


def takes_raw_inputs(layer):
    """Makes `layer`'s `__call__` pass Python strings and lists to `call` as they are.

    Missing publicly: Keras converts a layer's positional arguments to tensors and refuses
    strings unless two private attributes say otherwise; keras-hub's `PreprocessingLayer` sets the
    same two. No upstream issue filed. Remove when Keras has a public switch for it.
    """
    layer._convert_input_args = False
    layer._allow_non_tensor_positional_args = True


# keras-hub


def transformer_sublayers(hub_layer):
    """The weight-holding sublayers of a keras-hub `TransformerEncoder` / `TransformerDecoder`
    (self-attention and feed-forward), by kzoo's names:
    {"query", "key", "value", "output", "attention_norm", "intermediate", "feed_forward_output",
    "feed_forward_norm"}.

    Missing publicly: keras-hub keeps these sublayers (and its `MultiHeadAttention`'s
    projections) as `_attributes`. No upstream issue filed.
    Remove when keras-hub exposes them, or read the weights by `variable.path` instead.
    """
    attention = hub_layer._self_attention_layer
    return {
        "query": attention._query_dense,
        "key": attention._key_dense,
        "value": attention._value_dense,
        "output": attention._output_dense,
        "attention_norm": hub_layer._self_attention_layer_norm,
        "intermediate": hub_layer._feedforward_intermediate_dense,
        "feed_forward_output": hub_layer._feedforward_output_dense,
        "feed_forward_norm": hub_layer._feedforward_layer_norm,
    }


def word_piece_special_tokens(tokenizer):
    """The special tokens a keras-hub `WordPieceTokenizer` keeps whole when splitting text
    (None when it splits them as any text).

    Missing publicly: the list keras-hub builds from its registered special tokens and the
    constructor's `special_tokens` (private `_special_tokens_for_splitting`). No upstream issue
    filed. Remove when keras-hub exposes it.
    """
    return tokenizer._special_tokens_for_splitting()


class FastWordPieceHook:
    """A mixin for a keras-hub `WordPieceTokenizer` (a `BertTokenizer`) that builds its
    TensorFlow WordPiece op itself: `fast_word_piece()` returns the
    `tensorflow_text.FastWordpieceTokenizer` the tokenizer then runs.

    Missing publicly: keras-hub builds the op in the private `_set_vocabulary_tf`, with a fixed
    byte limit per word (kzoo needs `max_word_length` characters to decide, as `tokenizers`
    does); this overrides it and sets the private `_fast_word_piece` it reads. No upstream issue
    filed. Remove when keras-hub's `WordPieceTokenizer` takes the byte limit (or the op).
    """

    def fast_word_piece(self):
        """The `tensorflow_text.FastWordpieceTokenizer` of the tokenizer's vocabulary."""
        raise NotImplementedError

    def _set_vocabulary_tf(self):
        self._fast_word_piece = self.fast_word_piece()


def replace_masker_selector(masker, selector):
    """Makes keras-hub's `MaskedLMMaskGenerator` `masker` choose positions with `selector` (a
    `tf_text.RandomItemSelector`) in place of its own.

    Missing publicly: a seed or a selector argument that makes the masker reproducible on a
    batch (its selector shuffles rows with a stateful op inside a parallel `map_fn`). This calls
    the private `_maybe_initialize_tf` (which builds the masker's selector, once) and sets
    `_random_selector`. No upstream issue filed.
    Remove when keras-hub's masker masks reproducibly under a seed.
    """
    masker._maybe_initialize_tf()
    masker._random_selector = selector


# TensorFlow (TFLite converter)


def disable_fuse_mul_and_fc(converter):
    """Stops `converter` folding a multiplication into the next fully connected layer's weights.

    Missing publicly: a converter option per fusion; this sets the private
    `_experimental_disable_fuse_mul_and_fc`. Upstream: tensorflow/tensorflow#35176 (how to keep
    the converter from fusing ops; answered that there is no option).
    Remove when the converter has a public option for it.
    """
    converter._experimental_disable_fuse_mul_and_fc = True


def disable_per_channel_quantization(converter):
    """Makes `converter` quantize weights per tensor (one scale each) rather than per channel.

    Missing publicly: a converter option for it; this sets the private
    `_experimental_disable_per_channel`. No upstream issue filed.
    Remove when the converter has a public option for it.
    """
    converter._experimental_disable_per_channel = True


@contextlib.contextmanager
def converter_loads_no_weights():
    """Within it, the TFLite converter's own load of a SavedModel in Python leaves the variables
    unread.

    The converter saves concrete functions as a SavedModel in a temporary folder, loads it back in
    Python (`tensorflow.lite.python.lite._load`) only for its signatures and graph, then converts
    the folder in C++, which reads the weights from the folder itself. The Python load restores
    every variable: a whole copy of the weights held through the conversion. Loaded with
    `experimental_skip_checkpoint`, the variables are `UninitializedVariable`s, which hold no
    memory. Missing publicly: a converter option not to load the weights in Python. No upstream
    issue filed. Remove when the converter converts concrete functions without that load.
    """
    import tensorflow as tf
    from tensorflow.lite.python import lite

    load = lite._load
    lite._load = lambda path, tags: load(path, tags, tf.saved_model.LoadOptions(experimental_skip_checkpoint=True))
    try:
        yield
    finally:
        lite._load = load


# tensorflow-datasets


def progress_bar_enabled():
    """Whether tensorflow-datasets shows its progress bars (`tfds.display_progress_bar`'s setting).

    Missing publicly: a getter beside `tfds.display_progress_bar(enable)`; this reads the private
    `tqdm_utils._active` (True when absent). No upstream issue filed.
    Remove when tensorflow-datasets has a getter.
    """
    from tensorflow_datasets.core.utils import tqdm_utils

    return getattr(tqdm_utils, "_active", True)


# jinja2


def jinja_pass_arg(function):
    """What a jinja2 filter or test asks to be passed first: "context", "eval_context",
    "environment" (set by `jinja2.pass_context` and its siblings), or None.

    Missing publicly: jinja2 reads the marker with the private `jinja2.utils._PassArg`.
    No upstream issue filed. Remove when jinja2 exposes the marker's reader.
    """
    import jinja2

    pass_arg = jinja2.utils._PassArg.from_obj(function)
    return None if pass_arg is None else pass_arg.name


def jinja_namespace_attributes(namespace):
    """The attributes a template set on a jinja2 `namespace()`, as a dict (the namespace's own).

    Missing publicly: a `jinja2.utils.Namespace` lists its attributes only in its repr; they are
    in the private (name-mangled) `_Namespace__attrs`. No upstream issue filed. Remove when
    jinja2 exposes them.
    """
    return object.__getattribute__(namespace, "_Namespace__attrs")


# The Python standard library


def parser_actions(parser):
    """The `argparse.Action`s of `parser`, each argument's (its help text may be edited).

    Missing publicly: argparse has no accessor for a parser's actions (the private `_actions`).
    No upstream issue filed. Remove when argparse has one.
    """
    return parser._actions
