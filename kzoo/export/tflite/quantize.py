"""Quantized TFLite models by Google's ai-edge-quantizer, as litert-torch quantizes its bundles.

A float32 file (`kzoo.export.tflite.convert`) goes in, the recipe named comes out. Its int8
is also the more exact: on SmolLM2, TensorFlow's dynamic-range int8 raised the held-out
cross-entropy far more (BENCHMARKS.md).
"""

import contextlib
import io

from kzoo import logs
from kzoo.export.tflite.graph_passes import embedding_lookups

INT8, INT4 = "int8_channelwise", "int4_blockwise32"
INT4_BLOCK = 32
# What each quantization makes of the weights and activations.
QUANTIZATIONS = {
    INT8: "int8 weights with a scale per output channel, float32 activations quantized per call "
    "(ai-edge-quantizer's dynamic_wi8_afp32)",
    INT4: f"int4 weights in blocks of {INT4_BLOCK} along each input dimension, float32 activations quantized per "
    "call (ai-edge-quantizer's dynamic_wi4b32_afp32)",
}
_RECIPES = {INT8: "dynamic_wi8_afp32", INT4: "dynamic_wi4b32_afp32"}


def quantize(flatbuffer, conversion):
    """The float32 TFLite model `flatbuffer` quantized by ai-edge-quantizer as `conversion` says
    (`INT8` or `INT4`), its table lookups first made EMBEDDING_LOOKUP ops (`embedding_lookups`)."""
    import ai_edge_quantizer
    from ai_edge_quantizer import recipe

    quantizer = ai_edge_quantizer.Quantizer(embedding_lookups(flatbuffer), getattr(recipe, _RECIPES[conversion])())
    # It prints a size summary and progress bars.
    with logs.captured_stderr(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return bytes(quantizer.quantize().quantized_model)


def int4_problem(model):
    """Why `model`'s weights cannot be cut into int4 blocks, or None: every input dimension of
    its weight matrices (the width, the feed-forward width and the heads' width) must be a
    multiple of `INT4_BLOCK`."""
    backbone = model.backbone
    dimensions = {
        "hidden_dim": backbone.hidden_dim,
        "intermediate_dim": backbone.intermediate_dim,
        "num_heads x head_dim": backbone.num_heads * backbone.head_dim,
    }
    bad = {name: size for name, size in dimensions.items() if size % INT4_BLOCK}
    if not bad:
        return None
    sizes = ", ".join(f"{name} = {size}" for name, size in bad.items())
    return f"its weights are cut into blocks of {INT4_BLOCK}, and {sizes} is not a multiple of {INT4_BLOCK}"
