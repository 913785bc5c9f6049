"""`kzoo._compat` holds every use of another library's private API, and each still works.

- `test_no_private_api_outside_compat` reads the sources of kzoo/, recipes/ and export/ and
  fails, naming the file and line, on a private use anywhere but `kzoo/_compat.py`: an import
  of a private module (`keras.src`, `keras_hub.src`, `tensorflow.python`, ...) or of a `_name`;
  an `x._name` of an object other than `self` / `cls` (`super()._name` included: a call up to
  another library's private method); a `getattr(x, "_name")` and its siblings.
- `test_no_private_override_outside_compat` imports kzoo's modules and fails on a method
  `_name` of a kzoo class that another library's base class defines (an override of a private
  hook).
- The other tests call each compat function on a tiny object, so that an upgrade of keras,
  keras-hub, TensorFlow or tensorflow-datasets that breaks one fails here, naming it.

kzoo's own private names (`kzoo.ops._fusion`, `_Namespace._check`, an attribute of an object of
a kzoo class) are kzoo's to use: `KZOO_PRIVATE_NAMES` lists those read outside `self`.
"""

import argparse
import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import jinja2
import keras
import numpy as np
import pytest
import tensorflow as tf

import kzoo
from kzoo import _compat

REPOSITORY = Path(__file__).resolve().parents[1]
SCANNED = ["kzoo", "recipes", "export"]
COMPAT = REPOSITORY / "kzoo" / "_compat.py"

# Modules that are some library's internals, whatever their names.
PRIVATE_MODULES = ("keras.src", "keras_hub.src", "tensorflow.python", "tf_keras.src", "tensorflow_datasets.core.utils")

# Private names of kzoo's own objects, read outside `self` (the attribute name: why it is kzoo's).
KZOO_PRIVATE_NAMES = {
    "_check": "chat_template's `_Namespace._check`, a kzoo class's static method",
    "_backend": "chat_template reads kzoo's `HFTokenizer._backend` (None on other tokenizers)",
}

# Private uses in files that other changes are editing now; each is to move into a compat
# function (given) by whoever finishes those files. (path, attribute): the compat function.
PENDING = {}
# Private overrides pending the same way: (kzoo class, method): what to do.
PENDING_OVERRIDES = {}
# Hooks another library documents as the way to extend it, though spelt `_name`.
DOCUMENTED_HOOKS = {
    # tensorflow-datasets: "implement _info, _split_generators and _generate_examples"
    # (https://www.tensorflow.org/datasets/add_dataset).
    "_info",
    "_split_generators",
    "_generate_examples",
}


def _is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source, filename="<source>", local_modules=()):
    """[(line, what)] of the private-API uses in Python `source` (see the module docstring);
    `local_modules`: the names of the modules beside it (a recipe's `_common`), its own."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            modules = []
        for module in modules:
            parts = module.split(".")
            if (
                parts[0] != "kzoo"
                and parts[0] not in local_modules
                and (module.startswith(PRIVATE_MODULES) or any(_is_private(part) for part in parts))
            ):
                found.append((node.lineno, f"import of {module}"))
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                if node.attr not in KZOO_PRIVATE_NAMES:
                    found.append((node.lineno, f"attribute {node.attr}"))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _is_private(node.args[1].value)
            and node.args[1].value not in KZOO_PRIVATE_NAMES
            and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls"))
        ):
            found.append((node.lineno, f"{node.func.id} of {node.args[1].value}"))
    return found


def _sources():
    for folder in SCANNED:
        for path in sorted((REPOSITORY / folder).rglob("*.py")):
            if path != COMPAT:
                yield path


def test_no_private_api_outside_compat():
    uses = []
    for path in _sources():
        relative = path.relative_to(REPOSITORY).as_posix()
        local_modules = {sibling.stem for sibling in path.parent.glob("*.py")}
        for line, what in private_uses(path.read_text(), relative, local_modules):
            if not any(relative == pending and what.endswith(name) for pending, name in PENDING):
                uses.append(f"{relative}:{line}: {what}")
    assert not uses, (
        "Another library's private API used outside kzoo/_compat.py (add a function there, with "
        "the upstream issue and when to remove it, and call it):\n" + "\n".join(uses)
    )


@pytest.mark.parametrize(
    "planted",
    [
        "from keras.src.utils import io_utils",
        "import keras_hub.src.layers",
        "from tensorflow_datasets.core.utils import tqdm_utils",
        "from keras import _private",
        "layers = model._flatten_layers(include_self=False)",
        "super()._save_model(epoch, batch, logs)",
        "converter._experimental_disable_per_channel = True",
        'bars = getattr(tqdm_utils, "_active", True)',
    ],
)
def test_the_scan_finds_a_planted_use(planted):
    assert private_uses(f"def f(model, converter, tqdm_utils):\n    {planted}\n"), planted


@pytest.mark.parametrize(
    "allowed",
    [
        "from kzoo.ops._fusion import run_op",
        "self._cache = None",
        "cls._registry = {}",
        'value = getattr(self, "_no_weight_decay", None)',
        "name = value.__name__",
        "_Namespace._check(name)",
    ],
)
def test_the_scan_allows_kzoo_own_names(allowed):
    assert private_uses(f"def f(self, cls, value, name):\n    {allowed}\n") == [], allowed


def _kzoo_classes():
    for info in pkgutil.walk_packages(kzoo.__path__, "kzoo."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if inspect.isclass(value) and value.__module__ == info.name:
                yield value


def private_overrides(cls):
    """[(owner, method, base)]: the `_name` methods that a class of `cls`'s bases (itself
    included) outside `kzoo._compat` defines and a base outside kzoo defines too (a mixin of
    kzoo's overriding another library's private method through `cls` counts)."""
    found = []
    foreign = [base for base in cls.__mro__ if not base.__module__.startswith("kzoo")]
    for owner in cls.__mro__:
        if not owner.__module__.startswith("kzoo") or owner.__module__ == "kzoo._compat":
            continue
        for name, value in vars(owner).items():
            if not (_is_private(name) and callable(value)) or name in DOCUMENTED_HOOKS:
                continue
            base = next((base for base in foreign if name in vars(base)), None)
            if base is not None:
                found.append(
                    (f"{owner.__module__}.{owner.__qualname__}", name, f"{base.__module__}.{base.__qualname__}")
                )
    return found


def test_no_private_override_outside_compat():
    overrides = set()
    for cls in _kzoo_classes():
        for owner, name, base in private_overrides(cls):
            if (owner, name) not in PENDING_OVERRIDES:
                overrides.add(f"{owner}.{name} overrides {base}.{name}")
    assert not overrides, "Private methods of another library overridden outside kzoo/_compat.py:\n" + "\n".join(
        sorted(overrides)
    )


def test_the_override_check_finds_a_planted_override():
    class Planted(keras.callbacks.ModelCheckpoint):
        def _save_model(self, epoch, batch, logs):
            pass

    Planted.__module__ = "kzoo.planted"
    base = "keras.src.callbacks.model_checkpoint.ModelCheckpoint"
    found = private_overrides(Planted)
    assert found == [(f"kzoo.planted.{Planted.__qualname__}", "_save_model", base)]


# Each compat function on a tiny object: what an upgrade breaks fails here first, by name.


def _dense_model():
    inputs = keras.Input((3,))
    inner = keras.Sequential([keras.layers.Dense(2, name="inner_dense")], name="inner")
    return keras.Model(inputs, keras.layers.Dense(1, name="outer_dense")(inner(inputs)))


def test_sublayers():
    names = [layer.name for layer in _compat.sublayers(_dense_model())]
    assert "inner_dense" in names and "outer_dense" in names, f"_compat.sublayers: {names}"


def test_keras_mask():
    embedded = keras.layers.Embedding(5, 2, mask_zero=True)(np.array([[1, 0]]))
    mask = _compat.keras_mask(embedded)
    assert mask is not None, "_compat.keras_mask found no mask on an Embedding(mask_zero=True) output"
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(mask), [[True, False]])
    assert _compat.keras_mask(keras.ops.ones((1, 2))) is None, "_compat.keras_mask: a mask on a plain tensor"


def test_int4_kernel_input_dim():
    layer = keras.layers.Dense(4)
    layer.build((None, 6))
    layer.quantize("int4")
    assert _compat.int4_kernel_input_dim(layer) == 6, "_compat.int4_kernel_input_dim"


def test_forgotten_uninitialized_variables():
    from keras.src.backend.common import global_state  # the registry the function restores

    before = list(global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True))
    with _compat.forgotten_uninitialized_variables(), keras.StatelessScope(initialize_variables=False):
        layer = keras.layers.Dense(3)
        layer.build((None, 2))
        assert global_state.get_global_attribute("uninitialized_variables") != before, (
            "_compat.forgotten_uninitialized_variables: Keras no longer queues the variables it "
            "restores (drop the function if Keras stopped queueing them)"
        )
    after = global_state.get_global_attribute("uninitialized_variables", [])
    assert list(after) == before, "_compat.forgotten_uninitialized_variables left variables queued"


# Run under JAX in a fresh process, TensorFlow installed but not imported: serializes layers (with
# kzoo, one of kzoo's too) and says which modules that imported, whether the configs are the same
# once TensorFlow is imported, and a TensorFlow object's config.
SERIALIZE = """
import json, sys
import keras
layers = [keras.layers.Dense(3, kernel_initializer="he_normal")]
if sys.argv[1] == "kzoo":
    import kzoo
    layers.append(kzoo.layers.RMSNormalization(epsilon=1e-5))
configs = [keras.saving.serialize_keras_object(layer) for layer in layers]
before = sorted(name for name in ("tensorflow", "keras_hub") if name in sys.modules)
import tensorflow as tf
print(json.dumps(dict(before=before, same=configs == [keras.saving.serialize_keras_object(x) for x in layers],
                      shape=keras.saving.serialize_keras_object(tf.TensorShape([2, None])))))
"""


@pytest.mark.e2e  # two fresh processes under JAX
@pytest.mark.parametrize("imports", ["keras", "kzoo"])
def test_serialize_without_importing_tensorflow(imports):
    import json
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", SERIALIZE, imports],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPOSITORY,
        env={**os.environ, "KERAS_BACKEND": "jax"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    result = json.loads(result.stdout.strip().splitlines()[-1])
    # `import kzoo` calls it under JAX. Keras alone imports TensorFlow to serialize any object:
    # when that fails, Keras no longer does, and the compat function can go.
    name = "_compat.serialize_without_importing_tensorflow"
    assert result["before"] == ([] if imports == "kzoo" else ["tensorflow"]), name
    assert result["same"] and result["shape"] == [2, None], name


def test_takes_raw_inputs():
    class Length(keras.layers.Layer):
        def call(self, text):
            return len(text)

    with pytest.raises(ValueError, match="positional"):
        Length()("four")
    layer = Length()
    _compat.takes_raw_inputs(layer)
    assert layer("four") == 4, "_compat.takes_raw_inputs"


def test_print_msg(capsys):
    keras.config.enable_interactive_logging()
    _compat.print_msg("kzoo compat message")
    assert capsys.readouterr().out == "kzoo compat message\n", "_compat.print_msg"


@pytest.mark.parametrize("writes", [True, False])
def test_model_checkpoint(tmp_path, capsys, writes):
    written = []

    class Recording(_compat.ModelCheckpoint):
        def writes(self, filepath):
            return writes

        def write(self, filepath):
            written.append(filepath)
            self.model.save_weights(filepath)

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(loss="mse")
    path = str(tmp_path / "epoch_{epoch}.weights.h5")
    callback = Recording(path, save_weights_only=True, verbose=1)
    model.fit(np.ones((4, 2)), np.ones((4, 1)), epochs=2, verbose=0, callbacks=[callback])
    expected = [str(tmp_path / f"epoch_{epoch}.weights.h5") for epoch in (1, 2)]
    assert written == (expected if writes else []), f"_compat.ModelCheckpoint.write calls: {written}"
    assert all(Path(file).exists() for file in expected), "_compat.ModelCheckpoint saved no file"
    assert "Epoch 2: finished saving model to" in capsys.readouterr().out, "_compat.ModelCheckpoint's message"


def test_multi_worker_trainer_mixin_hooks():
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    for name, parameters in [
        ("_maybe_symbolic_build", ["self", "iterator", "data_batch"]),
        ("_make_function", ["self", "step_function"]),
    ]:
        method = getattr(TensorFlowTrainer, name, None)
        assert method is not None, f"_compat.MultiWorkerTrainerMixin: Keras' trainer has no {name}"
        found = list(inspect.signature(method).parameters)
        assert found == parameters, f"_compat.MultiWorkerTrainerMixin: {name}{found}, expected {parameters}"
    assert "_distribute_strategy" in vars(keras.Model()), "_compat.MultiWorkerTrainerMixin: no _distribute_strategy"


@pytest.mark.parametrize("mixin", [True, False])
def test_optimizer_built_before_tracing(mixin):
    traces = []

    class Counting(*((_compat.OptimizerBuiltBeforeTracing,) if mixin else ()), keras.Model):
        def train_step(self, data):
            traces.append(data)
            return super().train_step(data)

    inputs = keras.Input((2,))
    model = Counting(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="adam", loss="mse", jit_compile=False)
    model.fit(np.ones((4, 2)), np.ones((4, 1)), epochs=2, verbose=0)
    if mixin:
        assert len(traces) == 1, f"_compat.OptimizerBuiltBeforeTracing: the train step traced {len(traces)} times"
    else:  # Keras' own trainer: once it traces once, the mixin can go.
        assert len(traces) == 2, "_compat.OptimizerBuiltBeforeTracing: Keras traces the train step once now"


def test_in_multi_worker_mode():
    assert not _compat.in_multi_worker_mode(tf.distribute.get_strategy()), "_compat.in_multi_worker_mode"


@pytest.mark.parametrize("kind", ["TransformerEncoder", "TransformerDecoder"])
def test_transformer_sublayers(kind):
    import keras_hub

    hub_layer = getattr(keras_hub.layers, kind)(intermediate_dim=8, num_heads=2)
    hub_layer.build((None, 3, 4))
    sublayers = _compat.transformer_sublayers(hub_layer)
    assert {name: bool(layer.weights) for name, layer in sublayers.items()} == dict.fromkeys(sublayers, True), (
        f"_compat.transformer_sublayers({kind})"
    )
    assert len(sublayers) == 8


def test_word_piece_special_tokens():
    import keras_hub

    tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=["[PAD]", "[UNK]", "[X]", "a"], special_tokens=["[X]"], special_tokens_in_strings=True
    )
    assert "[X]" in (_compat.word_piece_special_tokens(tokenizer) or []), "_compat.word_piece_special_tokens"


def test_replace_masker_selector():
    import keras_hub
    import tensorflow_text as tf_text

    masker = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=10, mask_selection_rate=1.0, mask_token_id=9, mask_selection_length=3
    )
    # The masker's own selector would select every token; this one may select only token 2.
    selector = tf_text.RandomItemSelector(max_selections_per_batch=3, selection_rate=1.0, unselectable_ids=[1, 3])
    _compat.replace_masker_selector(masker, selector)
    # Traced, as in kzoo's pipelines (eagerly, keras-hub masks in NumPy, without the selector).
    masked = tf.function(masker)(tf.constant([[1, 2, 3]]))
    assert masked["mask_positions"].numpy().tolist() == [[1, 0, 0]], "_compat.replace_masker_selector"
    assert masked["mask_weights"].numpy().tolist() == [[1.0, 0.0, 0.0]], "_compat.replace_masker_selector"


def _converter():
    function = tf.function(lambda x: x * 2.0, input_signature=[tf.TensorSpec([2], tf.float32)])
    return tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()])


@pytest.mark.parametrize(
    "function, attribute",
    [
        (_compat.disable_fuse_mul_and_fc, "_experimental_disable_fuse_mul_and_fc"),
        (_compat.disable_per_channel_quantization, "_experimental_disable_per_channel"),
    ],
)
def test_converter_options(function, attribute):
    converter = _converter()
    # Setting an attribute the converter no longer reads would change nothing, silently.
    assert getattr(converter, attribute, None) is False, f"_compat.{function.__name__}: no {attribute}"
    function(converter)
    assert getattr(converter, attribute) is True


def test_converter_loads_no_weights():
    variable = tf.Variable([1.0, 2.0])
    module = tf.Module()
    module.variable = variable
    function = tf.function(lambda x: x * variable, input_signature=[tf.TensorSpec([2], tf.float32)])
    concrete = function.get_concrete_function()
    expected = tf.lite.TFLiteConverter.from_concrete_functions([concrete], module).convert()
    from tensorflow.lite.python import lite

    loaded = []
    load = lite._load
    lite._load = lambda *args: loaded.append(load(*args)) or loaded[-1]
    try:
        with _compat.converter_loads_no_weights():
            converted = tf.lite.TFLiteConverter.from_concrete_functions([concrete], module).convert()
    finally:
        lite._load = load
    # The converter still loads the SavedModel in Python (else the entry patches nothing), its
    # variable unread there, and the file (read by the C++ converter) is the same.
    assert loaded, "_compat.converter_loads_no_weights: the converter no longer calls lite._load"
    assert not loaded[0].variable.is_initialized(), "_compat.converter_loads_no_weights"
    assert converted == expected, "_compat.converter_loads_no_weights"


def test_progress_bar_enabled():
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core.utils import tqdm_utils

    assert hasattr(tqdm_utils, "_active"), "_compat.progress_bar_enabled: tfds has no tqdm_utils._active"
    before = _compat.progress_bar_enabled()
    try:
        tfds.display_progress_bar(False)
        assert _compat.progress_bar_enabled() is False, "_compat.progress_bar_enabled"
        tfds.display_progress_bar(True)
        assert _compat.progress_bar_enabled() is True, "_compat.progress_bar_enabled"
    finally:
        tfds.display_progress_bar(before)


def test_jinja_pass_arg():
    @jinja2.pass_eval_context
    def marked(eval_context, value):
        return value

    assert _compat.jinja_pass_arg(marked) == "eval_context", "_compat.jinja_pass_arg"
    assert _compat.jinja_pass_arg(len) is None, "_compat.jinja_pass_arg"


def test_jinja_namespace_attributes():
    namespace = jinja2.utils.Namespace(count=1)
    namespace["items"] = [2]
    assert _compat.jinja_namespace_attributes(namespace) == {"count": 1, "items": [2]}, (
        "_compat.jinja_namespace_attributes"
    )


def test_parser_actions():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int)
    assert "steps" in [action.dest for action in _compat.parser_actions(parser)], "_compat.parser_actions"


def test_fast_word_piece_hook():
    """keras-hub builds its WordPiece op where the hook takes over: kzoo's BertTokenizer splits a
    word of 60 two-byte letters (within its `max_word_length` of 100 characters), which keras-hub's
    own op (100 bytes a word) makes [UNK]."""
    import keras_hub

    from kzoo.tokenizers.bert import BertTokenizer

    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "ж", "##ж"]
    word = "ж" * 60
    plain = keras_hub.tokenizers.WordPieceTokenizer(vocabulary, lowercase=False, _allow_python_workflow=False)
    assert plain(word).numpy().tolist() == [1]
    hooked = BertTokenizer(vocabulary, lowercase=False)(word).tolist()
    assert hooked == [5] + [6] * 59, f"_compat.FastWordPieceHook: keras-hub did not call the hook ({hooked})"
