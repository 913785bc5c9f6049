"""Which of a GGUF's finer weights an int4 export re-rounds into int4 blocks, measured per model.

int4 keeps a 4-bit source's own blocks and holds a finer source's weights (Q5_0, Q6_K, Q8_0) in
int8 per channel (`quantize`), so that int4 never holds fewer bits than the source. That rule is
safe and costs bytes: a llama.cpp "Q4_K_M" file keeps half its feed-forward down-projections in
Q6_K, 85 MB more of Qwen2.5-Coder-1.5B's int4 bundle in int8 than in int4 blocks. What
re-rounding such a group costs depends on the model, not on the source type: in int4 blocks
Qwen2.5-Coder-1.5B's Q6_K down-projections move its next-token distributions by 0.008 nats (KL
divergence), Gemma 3 270M's by 0.18 (BENCHMARKS.md, "int4 re-rounding measured per model").

So `choose` measures, where an export is asked to (`int4_rerounding`: re-rounding buys bytes, and
on the hosts measured little or no decode time). The finer weights of the transformer blocks come in groups, the same
weight of every block (the down-projections, the value projections); each group is re-rounded
in the Keras model as ai-edge-quantizer rounds a weight into int4 blocks (`int4_rounded`), the
KL divergence of the model's next-token distributions on a few held-out rows from its own is
measured, and the groups are taken, cheapest per value first, while their mean divergence
together is at most `budget` nats. The held-out cross-entropy alone would not do: with four
groups re-rounded, Qwen2.5-Coder-0.5B's moved by -0.006 nats while its top-1 agreement with
itself fell to 0.82 and its greedy text changed. The output layer (an untied head, a tied token
table) is no candidate: in int4 blocks it raised the held-out cross-entropy by 0.03-0.12 nats in
every model measured, and as the largest weight its measurement would hold the most memory.
`quantize.quantize_file` then leaves the chosen weights out of the int8 ones, found in the
converted file by `quantize.Fingerprint` (the converter transposes and reshapes them, and a
weight's values are all it keeps of its name).
"""

import dataclasses
import itertools
import re
import tempfile
from pathlib import Path

import keras
import numpy as np

from kzoo import _compat
from kzoo.export import memory
from kzoo.export import verification
from kzoo.export.tflite import quantize
from kzoo.models.tied_logits import TiedLogits

# `choose`'s budget when none is given: the mean KL divergence (nats) from the model's own
# next-token distributions that Qwen2.5-Coder-1.5B's Q6_K down-projections cost in int4 blocks.
BUDGET = 0.01
# Held-out rows (of at most `POSITIONS` positions) each measurement runs, a forward pass of the
# model per group measured: compared on the same rows as the model's own, 4 rows gave Qwen2.5-
# Coder-1.5B's groups the costs 8 rows give within about 0.004 nats.
ROWS, POSITIONS = 4, 256
# The least share of the model's weight values a group must hold to be measured: a smaller one
# (Qwen2.5-Coder-1.5B's value projections, 0.3%) would cost a forward pass for next to no bytes.
LEAST_SHARE = 0.01
# Output rows of a weight `candidate` fits grids to: a finer source's grid shows in every block.
_SAMPLE_ROWS = 64
# Values `Weight.int4_rounded` rounds at a time: its float64 temporaries stay a few megabytes.
_CHUNK_VALUES = 1 << 20


@dataclasses.dataclass
class Weight:
    """A weight of the Keras model that the exported file's FULLY_CONNECTED op reads: `variable`,
    whose leading axes are the op's `inputs` (a kernel) or, with `inputs_first` False, its last
    axis (a token table read as the output layer)."""

    variable: keras.Variable
    inputs: int
    inputs_first: bool = True

    @property
    def group(self):
        """The weight's place with the block's number left out: the same in every block."""
        return re.sub(r"_\d+/", "_*/", self.variable.path)

    @property
    def size(self):
        return int(np.prod(self.variable.shape))

    def values(self):
        """The variable's values (a NumPy copy)."""
        return np.asarray(keras.ops.convert_to_numpy(self.variable), np.float32)

    def matrix(self, values=None, rows=None):
        """The weight as the op's `(outputs, inputs)` matrix, of its first `rows` outputs (all: None)."""
        values = self.values() if values is None else values
        if not self.inputs_first:
            return values.reshape(-1, self.inputs)[:rows]
        return np.ascontiguousarray(values.reshape(self.inputs, -1)[:, :rows].T)

    def int4_rounded(self, values):
        """`int4_rounded` of the weight, in the variable's own layout (no transposed copy; the
        temporaries a chunk of blocks at a time)."""
        rounded = np.empty_like(values)
        target = rounded.reshape(self._block_shape()[0])
        for cut, blocks, axis in self._block_chunks(values):
            target[cut] = _int4_blocks(blocks, axis)
        return rounded

    def int4_loads(self, values):
        """Whether every block's int4 scale is above 0: LiteRT's XNNPACK refuses a model with a
        scale of 0 (a block of zeros, as Qwen2.5-Coder-0.5B's feed-forward has), and would refuse
        the bundle."""
        return all(np.all(_int4_scale(blocks, axis) > 0) for _, blocks, axis in self._block_chunks(values))

    def _block_shape(self):
        """The variable's values as blocks along the inputs: `(inputs / 32, 32, outputs)` for a
        kernel, `(outputs, inputs / 32, 32)` for a table; and the blocks' axis."""
        block = quantize.INT4_BLOCK
        if self.inputs_first:
            return (self.inputs // block, block, -1), 1
        return (-1, self.inputs // block, block), 2

    def _block_chunks(self, values):
        """`(index, blocks, axis)` over `values` in chunks of about `_CHUNK_VALUES` values."""
        shape, axis = self._block_shape()
        blocks = values.reshape(shape)
        step = max(1, _CHUNK_VALUES // blocks[0].size)
        for start in range(0, len(blocks), step):
            yield slice(start, start + step), blocks[start : start + step], axis


def weight_matrices(model):
    """The `Weight`s of `model` an exported file reads through FULLY_CONNECTED ops: Dense and
    EinsumDense kernels (their inputs the leading axes their equation contracts) and a tied output
    layer's token table, its inputs the table's width. Quantized and LoRA layers are left out:
    their variables are not the weights the file holds."""
    found = {}
    for layer in _compat.sublayers(model):
        if getattr(layer, "quantization_mode", None) is not None or getattr(layer, "lora_enabled", False):
            continue
        if isinstance(layer, TiedLogits):
            table = getattr(layer.embedding, "token_embedding", layer.embedding)
            if table.quantization_mode is None and not getattr(table, "lora_enabled", False):
                found.setdefault(id(table.embeddings), Weight(table.embeddings, table.embeddings.shape[1], False))
        elif isinstance(layer, keras.layers.EinsumDense):
            inputs, kernel = layer.equation.split("->")[0].split(",")
            axes = [i for i, letter in enumerate(kernel) if letter in inputs]
            if axes == list(range(len(axes))):  # the contracted axes lead (as in every kzoo layer)
                size = int(np.prod([layer.kernel.shape[i] for i in axes]))
                found.setdefault(id(layer.kernel), Weight(layer.kernel, size))
        elif isinstance(layer, keras.layers.Dense):
            found.setdefault(id(layer.kernel), Weight(layer.kernel, layer.kernel.shape[0]))
    return list(found.values())


def candidate(matrix):
    """Whether an `(outputs, inputs)` weight looks like a finer source's, judged on its first
    rows: a grid of up to 256 levels in every block of 16 (`quantize.finer_source`), not one of
    16 levels in every block of 32 (a 4-bit source, whose blocks int4 keeps as they are)."""
    sample = matrix[:_SAMPLE_ROWS]
    if sample.shape[-1] % quantize.INT4_BLOCK:
        return False
    return quantize.finer_source(sample) and not quantize.four_bit_source(sample)


def int4_rounded(matrix):
    """An `(outputs, inputs)` float32 weight after ai-edge-quantizer's int4 blocks and back:
    each block of `quantize.INT4_BLOCK` inputs symmetric, its scale the block's largest magnitude
    over 7 (rounded to bfloat16 and float16, by the quantizer's own function), values rounded to
    the nearest code in [-8, 7].

    Example:
    >>> weights = np.zeros((1, 32), "float32")
    >>> weights[0, :3] = 0.7, -0.35, 0.01
    >>> int4_rounded(weights)[0, :3].tolist()  # the scale 0.1 rounded to bfloat16: 0.10009765625
    [0.70068359375, -0.30029296875, 0.0]
    """
    rows, inputs = matrix.shape
    blocks = np.asarray(matrix, np.float32).reshape(rows, inputs // quantize.INT4_BLOCK, quantize.INT4_BLOCK)
    return _int4_blocks(blocks, 2).reshape(rows, inputs)


def _int4_blocks(blocks, axis):
    """`int4_rounded` of float32 blocks of `quantize.INT4_BLOCK` values along `axis`."""
    scale = _int4_scale(blocks, axis)
    codes = np.clip(np.rint(blocks / np.where(scale > 0, scale, 1)), -8, 7)
    return (codes * scale).astype(np.float32)


def _int4_scale(blocks, axis):
    """ai-edge-quantizer's int4 scale of each block along `axis` (its own function)."""
    from ai_edge_quantizer import qtyping
    from ai_edge_quantizer.algorithms.uniform_quantize import uniform_quantize_tensor

    _, scale = uniform_quantize_tensor.tensor_zp_scale_from_min_max(
        blocks.min(axis, keepdims=True),
        blocks.max(axis, keepdims=True),
        num_bits=4,
        symmetric=True,
        granularity=qtyping.QuantGranularity.BLOCKWISE_32,
    )
    return scale


def choose(model, token_ids, logits=None, sample_weight=None, budget=None, work_dir=None):
    """The groups of `model`'s finer-source weights to re-round into int4 blocks (see the module
    docstring), measured on held-out rows; the model's weights are as they were on return. A
    weight with a block int4 would give a scale of 0 (`Weight.int4_loads`) is in no group.

    Args:
        model: a causal LM.
        token_ids: int `(N, T)` held-out rows (the first `ROWS` rows and `POSITIONS` positions
            are measured).
        logits: the model's own logits `(N, T, V)` for the rows, or None (computed).
        sample_weight: `(N, T)` or None: the positions' weights in the means.
        budget: the mean divergence in nats that the chosen groups may cost together (None:
            `BUDGET`).
        work_dir: a folder for the measured weights' own values while they are re-rounded:
            None for a temporary one.

    Returns:
        A record: `budget`, `groups` (per candidate group: its `weights`, `values`, its
        `divergence` alone, the mean KL divergence of the model's next-token distribution with
        the group re-rounded from its own, in nats, and the `top1_agreement` of the two; None for
        a group of less than `LEAST_SHARE` of the model's weight values, which is not measured;
        and whether it is `rerounded`), the `divergence` and `top1_agreement` of the chosen groups
        together, and `fingerprints`, the chosen weights' `quantize.Fingerprint`s (for
        `quantize.quantize_file`; not JSON).
    """
    budget = BUDGET if budget is None else budget
    in_blocks = {id(v) for block in model.backbone.transformer_blocks for v in block.weights}
    groups, total = {}, 0
    for weight in weight_matrices(model):
        total += weight.size
        if id(weight.variable) not in in_blocks:  # the output layer: see the module docstring
            continue
        values = weight.values()  # one copy for both tests
        if candidate(weight.matrix(values, rows=_SAMPLE_ROWS)) and weight.int4_loads(values):
            groups.setdefault(weight.group, []).append(weight)
    sizes = {name: sum(weight.size for weight in weights) for name, weights in groups.items()}
    measured = [name for name in groups if sizes[name] >= LEAST_SHARE * total]
    alone, chosen, together = {}, (), (0.0, 1.0)
    if measured:

        def cut(values):  # the rows and positions measured
            return None if values is None else np.asarray(values)[:ROWS, :POSITIONS]

        with _Measurement(model, groups, cut(token_ids), cut(logits), cut(sample_weight), work_dir) as measure:
            alone = {name: measure.divergence((name,)) for name in measured}
            # The cheapest per value first, while their divergences alone add up within the
            # budget; then the groups together, measured, the last taken left out until they fit.
            spent = 0.0
            for name in sorted(measured, key=lambda name: alone[name][0] / sizes[name]):
                if spent + alone[name][0] <= budget:
                    chosen, spent = (*chosen, name), spent + alone[name][0]
            while len(chosen) > 1:
                together = measure.divergence(chosen)
                if together[0] <= budget:
                    break
                chosen = chosen[:-1]
            if len(chosen) == 1:
                together = alone[chosen[0]]
    record = {"budget": budget, "groups": {}, "divergence": together[0], "top1_agreement": together[1]}
    for name, weights in groups.items():
        divergence, agreement = alone.get(name, (None, None))
        record["groups"][name] = {
            "weights": len(weights),
            "values": sizes[name],
            "divergence": divergence,
            "top1_agreement": agreement,
            "rerounded": name in chosen,
        }
    record["fingerprints"] = [quantize.Fingerprint.of(w.values()) for name in chosen for w in groups[name]]
    return record


class _Measurement:
    """How far `model`'s next-token distributions on held-out rows move with some `groups` of its
    weights re-rounded, from its own (`logits`, or computed on entering); while entered, the
    weights' own values wait in files (`_Originals`), and on leaving are back."""

    def __init__(self, model, groups, token_ids, logits, sample_weight, work_dir):
        self.model, self.groups = model, groups
        self.token_ids, self.own, self.sample_weight = token_ids, logits, sample_weight
        self.work_dir = work_dir

    def __enter__(self):
        self.folder = tempfile.TemporaryDirectory(dir=self.work_dir)
        self.originals = _Originals(Path(self.folder.name))
        if self.own is None:
            self.own = np.stack(list(self._rows()))
        return self

    def __exit__(self, *error):
        try:
            self._set(())  # every weight as it was
        finally:
            self.folder.cleanup()
            memory.release_freed_memory()

    def _set(self, chosen):
        for name, weights in self.groups.items():
            for weight in weights:
                if name in chosen:
                    self.originals.reround(weight)
                else:
                    self.originals.restore(weight)

    def _rows(self):
        """The model's logits `(T, V)` for each row, as its weights are now (a row at a time: V
        floats a position)."""
        for i in range(len(self.token_ids)):
            ids = self.token_ids[i : i + 1]
            yield keras.ops.convert_to_numpy(self.model({"token_ids": ids, "padding_mask": np.ones_like(ids)}))[0]

    def divergence(self, chosen):
        """`(mean KL divergence, top-1 agreement)` of the model's distributions with the groups
        `chosen` re-rounded from its own, weighted by the positions' weights."""
        self._set(chosen)
        total = divergence = agree = 0.0
        for i, logits in enumerate(self._rows()):
            weights = np.ones(len(logits)) if self.sample_weight is None else np.asarray(self.sample_weight[i], float)
            for start in range(0, len(logits), verification.POSITIONS_AT_ONCE):  # float64 a few positions at a time
                cut = slice(start, start + verification.POSITIONS_AT_ONCE)
                own, new = (_log_softmax(np.asarray(x[cut], np.float64)) for x in (self.own[i], logits))
                divergence += np.sum(weights[cut] * np.sum(np.exp(own) * (own - new), -1))
                agree += np.sum(weights[cut] * (own.argmax(-1) == new.argmax(-1)))
                total += np.sum(weights[cut])
            del logits
        return float(divergence / total), float(agree / total)


def _log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), -1, keepdims=True))


class _Originals:
    """The own values of weights while they hold their int4 rounding, kept in files of `folder`,
    so that at most one weight's values and its rounding are in memory beside the model."""

    def __init__(self, folder):
        self.folder, self.saved, self.files = folder, {}, itertools.count()

    def reround(self, weight):
        if id(weight.variable) in self.saved:
            return
        values = weight.values()
        path = self.folder / f"{next(self.files)}.npy"  # a new name: never a file still waiting
        np.save(path, values)
        self.saved[id(weight.variable)] = path
        rounded = weight.int4_rounded(values)
        del values
        weight.variable.assign(rounded)

    def restore(self, weight):
        path = self.saved.pop(id(weight.variable), None)
        if path is not None:
            weight.variable.assign(np.load(path))
            path.unlink()
