"""The shared read/write maps of Hugging Face checkpoints: kzoo variables <-> Hugging Face tensors.

Each model family (`kzoo/models/bert/bert_hf.py`, `kzoo/models/gpt/gpt_hf.py`,
`kzoo/models/decoder/decoder_hf.py`) registers a `Family` per `model_type`: how a `config.json`
becomes kzoo constructor arguments and back, a list of `TensorMap`s pairing Hugging Face tensor
names with kzoo variables, and how its tokenizer is read. The same maps serve reading
(`kzoo.checkpoints.hf.load`) and writing (`kzoo.checkpoints.hf.save`), so the two directions
cannot drift apart. A GGUF file (`kzoo.checkpoints.gguf.reader`) is read as a config and
tensors under the same names, through the same maps. `FAMILIES` is the one registry.
"""

import dataclasses
import math

import numpy as np

FAMILIES = {}


@dataclasses.dataclass(frozen=True, eq=False)
class TensorMap:
    """Hugging Face tensors `names` hold the values of the kzoo variables `weights`.

    Attributes:
        weights: tuple of kzoo variables (e.g. a `Dense`'s kernel and bias).
        names: tuple of Hugging Face tensor names (without the model's prefix).
        to_keras: `f(list of Hugging Face arrays) -> list of arrays, one per variable`.
        to_hf: `f(list of variable values) -> list of Hugging Face arrays`, its inverse.
        layers: the layers owning the weights, in their order (each a kernel and maybe a bias,
            or an embedding table), whose own calls give the values of quantized ones (see
            `values`); empty for variables read directly.
        transposed: the names whose arrays `to_keras` transposes (a `torch.nn.Linear`'s
            weight): a reader that can lay them out column-major (`read(name, order="F")`) saves
            the copy that makes the transpose contiguous.
    """

    weights: tuple
    names: tuple
    to_keras: object
    to_hf: object
    layers: tuple = ()
    transposed: tuple = ()


def linear(layer, name, input_axes=1, transposed=True):
    """`name.weight` (and `name.bias` where the layer has one) of a `torch.nn.Linear` (`(out,
    in)`, `transposed`) or of GPT-2's `Conv1D` (`(in, out)`) as the kernel (and bias) of a Keras
    `Dense` or `EinsumDense`, whose kernel's first `input_axes` axes are the input ones."""
    kernel_shape = tuple(layer.kernel.shape)
    inputs = math.prod(kernel_shape[:input_axes])
    bias = getattr(layer, "bias", None)

    def to_keras(arrays):
        weight = arrays[0].T if transposed else arrays[0]
        return [weight.reshape(kernel_shape)] + [b.reshape(bias.shape) for b in arrays[1:]]

    def to_hf(arrays):
        weight = arrays[0].reshape(inputs, -1)
        return [weight.T if transposed else weight] + [b.reshape(-1) for b in arrays[1:]]

    read_transposed = (f"{name}.weight",) if transposed else ()
    if bias is None:
        return TensorMap((layer.kernel,), (f"{name}.weight",), to_keras, to_hf, (layer,), read_transposed)
    names = (f"{name}.weight", f"{name}.bias")
    return TensorMap((layer.kernel, bias), names, to_keras, to_hf, (layer,), read_transposed)


def fused_linear(layers, name, transposed=True):
    """One `torch.nn.Linear` (or GPT-2 `Conv1D`, not `transposed`) `name` holding the projections of
    several `Dense` / `EinsumDense` `layers` one after another along its outputs: GPT-2's `c_attn`
    (query, key and value, with biases), Phi-3's `qkv_proj` and `gate_up_proj`."""
    kernel_shapes = [tuple(layer.kernel.shape) for layer in layers]
    biases = [getattr(layer, "bias", None) for layer in layers]
    sizes = [math.prod(shape[1:]) for shape in kernel_shapes]
    splits = np.cumsum(sizes)[:-1]

    def to_keras(arrays):
        weight = arrays[0] if transposed else arrays[0].T  # (outputs, in)
        kernels = [part.T.reshape(shape) for part, shape in zip(np.split(weight, splits), kernel_shapes)]
        if biases[0] is None:
            return kernels
        parts = np.split(arrays[1], splits)
        return [a for kernel, bias, part in zip(kernels, biases, parts) for a in (kernel, part.reshape(bias.shape))]

    def to_hf(arrays):
        kernels = arrays if biases[0] is None else arrays[0::2]
        weight = np.concatenate([kernel.reshape(kernel.shape[0], -1) for kernel in kernels], axis=1)  # (in, outputs)
        weight = weight.T if transposed else weight
        return [weight] if biases[0] is None else [weight, np.concatenate([b.reshape(-1) for b in arrays[1::2]])]

    if biases[0] is None:
        return TensorMap(tuple(layer.kernel for layer in layers), (f"{name}.weight",), to_keras, to_hf, tuple(layers))
    weights = tuple(weight for layer, bias in zip(layers, biases) for weight in (layer.kernel, bias))
    return TensorMap(weights, (f"{name}.weight", f"{name}.bias"), to_keras, to_hf, tuple(layers))


def norm(layer, name):
    """`name.weight` (and `name.bias`) as a LayerNorm's gamma and beta, or an RMSNorm's scale."""
    if hasattr(layer, "gamma"):
        return TensorMap((layer.gamma, layer.beta), (f"{name}.weight", f"{name}.bias"), list, list)
    return TensorMap((layer.scale,), (f"{name}.weight",), list, list)


def embedding(table, name, layer=None):
    """The tensor `name` as the embedding table `table` (a variable) of the `Embedding` `layer`."""
    return TensorMap((table,), (name,), list, list, () if layer is None else (layer,))


@dataclasses.dataclass(frozen=True)
class Family:
    """What kzoo knows of one `model_type`. The functions take the kzoo model (or its backbone).

    Attributes:
        model_type: the `config.json` `model_type`, e.g. "bert".
        backbone_cls: the kzoo backbone class.
        backbone_architecture: the `transformers` class of the bare backbone, e.g. "BertModel".
        backbone_config: `f(config dict, read) -> kzoo constructor kwargs`, where `read` is a
            `ConfigReader`: its fields, type- and range-checked, or a `CheckpointError` naming them.
        hf_config: `f(backbone) -> config dict` (architecture fields only).
        backbone_tensors: `f(backbone) -> [TensorMap]`, names without prefix.
        backbone_prefix: the prefix of the backbone's tensors inside a task model
            ("bert." / "transformer."), or a tuple of the prefixes checkpoints use (kzoo writes
            the first); a bare backbone has none.
        layer_pattern: a regex whose group 1 is the layer index in a tensor name (without
            prefix), to compare the config's layer count with the checkpoint's before building.
        num_layers_field: the config field of the layer count, named when they disagree.
        tokenizer: `f(folder, config) -> (tokenizer or None, the file it came from)`.
        optional_prefixes: tensor name prefixes (without the backbone prefix) that a
            checkpoint may lack; the layers keep their initialization and a warning names them
            (e.g. BERT's pooler, which `BertForMaskedLM` does not have).
        ignored: tensor name suffixes that are buffers, not weights (never reported).
        ignored_prefixes: tensor name prefixes of parts kzoo does not load (a vision tower).
        heads: `{task class name: Head}`.
    """

    model_type: str
    backbone_cls: type
    backbone_architecture: str
    backbone_config: object
    hf_config: object
    backbone_tensors: object
    backbone_prefix: str
    layer_pattern: str
    num_layers_field: str
    tokenizer: object
    optional_prefixes: tuple = ()
    ignored: tuple = ()
    ignored_prefixes: tuple = ()
    heads: dict = dataclasses.field(default_factory=dict)

    @property
    def prefixes(self):
        """The backbone prefixes checkpoints use, the one kzoo writes first."""
        return (self.backbone_prefix,) if isinstance(self.backbone_prefix, str) else tuple(self.backbone_prefix)


@dataclasses.dataclass(frozen=True)
class Head:
    """A task head's Hugging Face counterpart.

    Attributes:
        architectures: the `transformers` classes with this head, e.g.
            ("BertForMaskedLM", "BertForPreTraining"); kzoo writes the first.
        tensors: `f(task) -> [TensorMap]`: the head's tensors (full names).
        task_config: `f(config dict) -> task constructor kwargs` read from a checkpoint of this
            architecture (e.g. `num_classes`), used where the caller gives none.
        hf_config: `f(task) -> config fields` the architecture adds (e.g. `id2label`).
        tied: `{name: backbone tensor name}` (or `f(task) -> that dict`): tensors a checkpoint may
            hold as a copy of a tied one; they must equal it, since kzoo ties them.
        backbone_prefix: whether the architecture prefixes the backbone's tensors.
        has_optional: whether the architecture has the family's optional tensors (BERT's
            pooler: `BertForMaskedLM` and `BertForTokenClassification` are built without it).
    """

    architectures: tuple
    tensors: object = lambda task: []
    task_config: object = lambda config: {}
    hf_config: object = lambda task: {}
    tied: dict = dataclasses.field(default_factory=dict)
    backbone_prefix: bool = True
    has_optional: bool = True


def register_family(family):
    FAMILIES[family.model_type] = family


def head_of(family, task_cls):
    """The family's `Head` for a task class or the nearest base class it has one for, or None."""
    for cls in task_cls.__mro__:
        if cls.__name__ in family.heads:
            return family.heads[cls.__name__]
    return None


def values(map_):
    """The current values of a map's weights as float32 NumPy arrays, as the model computes with
    them: those of quantized layers through the layers' own calls (their stored integers and
    scales dequantized), others as stored (with LoRA)."""
    if not any(getattr(layer, "quantization_mode", None) for layer in map_.layers):
        return [np.asarray(weight.numpy(), "float32") for weight in map_.weights]
    return [array for layer in map_.layers for array in _called_weights(layer)]


def _called_weights(layer):
    """`[kernel]` or `[kernel, bias]` of a Dense / EinsumDense, or `[table]` of an Embedding, as
    its call computes them: on one-hot inputs, which an int8 layer's input quantization keeps exact."""
    from keras import ops

    if hasattr(layer, "input_dim"):  # an Embedding: its rows, looked up
        return [np.asarray(ops.convert_to_numpy(layer(ops.arange(layer.input_dim))), "float32")]
    kernel_shape = tuple(layer.kernel.shape)
    bias = None if getattr(layer, "bias", None) is None else np.asarray(layer.bias.numpy(), "float32")
    input_shape = _input_shape(layer, kernel_shape)
    eye = np.eye(math.prod(input_shape), dtype="float32").reshape(-1, *input_shape)  # one row per input unit
    output = np.asarray(ops.convert_to_numpy(layer(eye[None]))[0], "float32")
    kernel = output.reshape(kernel_shape) - (0 if bias is None else bias)
    return [kernel] + ([] if bias is None else [bias])


def _input_shape(layer, kernel_shape):
    """The shape of one input row of a Dense (`(d,)`) or an EinsumDense (its contracted axes)."""
    if not hasattr(layer, "equation"):
        return kernel_shape[:1]
    inputs, kernel = layer.equation.split("->")[0].split(",")
    sizes = dict(zip(kernel, kernel_shape))
    return tuple(sizes[axis] for axis in inputs if axis in kernel)
