"""TFLite conversion of a `ServingModule`, builtin ops only, in four precisions."""

import json
import warnings

import tensorflow as tf

from kzoo import _compat
from kzoo import logs
from kzoo.export import memory
from kzoo.export.serving_signatures import INFO_NAME
from kzoo.export.serving_signatures import captured_variables
from kzoo.export.tflite import graph_passes

# Format name -> what its weights and activations are. Every format keeps a
# float32 interface (int32 token ids in, float32 logits and caches out).
TFLITE_FORMATS = {
    "tflite_fp32": "float32 weights and activations",
    "tflite_fp16": "float16 weights, float32 activations",
    "tflite_int8_dynamic": "int8 weights, activations quantized per call (dynamic range)",
    "tflite_int8": "int8 weights and activations (full integer), calibrated on representative data",
}


def convert(signatures, tflite_format, representative_dataset=None, generation=True, fuse_scales=True, apart=False):
    """Converts a model's `ServingSignatures` to a TFLite flatbuffer with builtin ops only.

    Args:
        signatures: a `kzoo.export.ServingSignatures`; its TFLite functions
            become the file's signatures (`serving_default`, and `prefill`
            and `decode` for the generating models).
        tflite_format: a key of `TFLITE_FORMATS`.
        representative_dataset: for "tflite_int8", a callable returning an
            iterator of `(signature_key, {input_name: array})`.
        generation: bool, include `prefill` and `decode` where the model has them.
        fuse_scales: bool, let the converter fold a multiplication (a norm's scale) into the next
            fully connected layer's weights; False keeps it an op of its own (never where the
            embeddings are tied: see below).
        apart: bool, convert each function alone and merge the files (`graph_passes.Merge`):
            the converter's memory grows with the graph it holds (a decoder's four prefill
            signatures and decode at once held about twice what the largest one alone does).
            "tflite_fp32" only: a quantizing conversion decides per file.

    Returns:
        The flatbuffer (bytes), with `signatures.info` as its `kzoo_model` metadata (JSON)
        unless it is None (`kzoo.export.litertlm.RuntimeSignatures`).

    Raises:
        tf.lite's `ConverterError` when an op has no builtin TFLite kernel
        (kzoo never falls back to SELECT_TF_OPS, which needs the Flex delegate).
    """
    if tflite_format not in TFLITE_FORMATS:
        raise ValueError(f"Unknown TFLite format {tflite_format!r}; known: {sorted(TFLITE_FORMATS)}.")
    if apart and tflite_format != "tflite_fp32":
        raise ValueError(f"Only tflite_fp32 converts its functions apart; received {tflite_format!r}.")
    if apart:
        # Each function traced when reached and let go once converted, where the signatures can
        # (`traced_one_at_a_time`); each file merged as it comes: one graph and one file at a time.
        one_at_a_time = getattr(signatures, "traced_one_at_a_time", None)
        functions = one_at_a_time() if one_at_a_time else reversed(signatures.tflite_functions(generation))
        merge = graph_passes.Merge()
        for function in functions:
            flatbuffer = _converted([function], tflite_format, None, signatures.tied_embeddings, fuse_scales)
            merge.add(flatbuffer, function.graph.name)
            del flatbuffer, function
            memory.release_freed_memory()
        graph_passes.share_subgraphs(merge.model)
        flatbuffer = graph_passes.packed(merge.model, graph_passes.packed_size(merge.model))
        del merge
    else:
        functions = signatures.tflite_functions(generation)
        flatbuffer = _converted(
            functions, tflite_format, representative_dataset, signatures.tied_embeddings, fuse_scales
        )
        flatbuffer = graph_passes.shared_subgraphs(flatbuffer)
    if signatures.info is None:
        return flatbuffer
    return graph_passes.with_metadata(flatbuffer, INFO_NAME, json.dumps(signatures.info).encode("utf-8"))


def _converted(functions, tflite_format, representative_dataset, tied_embeddings, fuse_scales):
    """The converter's flatbuffer of the concrete `functions` (see `convert`)."""
    # The converter freezes what this module holds into constants: the variables alone. A
    # tokenizer's lookup tables (byte-level BPE) would become ops TFLite has no kernel for.
    variables = tf.Module(name="kzoo_tflite")
    variables.model_variables = captured_variables(functions)
    converter = tf.lite.TFLiteConverter.from_concrete_functions(functions, variables)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if tied_embeddings or not fuse_scales:
        # The converter folds a norm's scale into the next layer's weights; folded into a tied
        # token table, it makes the output projection a second table beside the lookup's.
        _compat.disable_fuse_mul_and_fc(converter)
    if tflite_format != "tflite_fp32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if tied_embeddings:
            # One int8 copy of a tied token table: per-channel scales would give
            # the output projection its own copy beside the lookup's.
            _compat.disable_per_channel_quantization(converter)
    if tflite_format == "tflite_fp16":
        converter.target_spec.supported_types = [tf.float16]
    elif tflite_format == "tflite_int8":
        if representative_dataset is None:
            raise ValueError("tflite_int8 needs a `representative_dataset`.")
        converter.representative_dataset = representative_dataset
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    # TF's calibrator still runs the deprecated tf.lite.Interpreter (kzoo runs LiteRT), and
    # prints its settings from C++.
    with warnings.catch_warnings(), logs.captured_stderr(), _compat.converter_loads_no_weights():
        warnings.filterwarnings("ignore", "(?s).*tf.lite.Interpreter is deprecated", UserWarning)
        flatbuffer = converter.convert()
    del converter, variables  # its SavedModel and graphs, freed before the next conversion or the passes
    memory.release_freed_memory()
    return flatbuffer
