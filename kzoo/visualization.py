"""Attention maps of kzoo transformers: the weights of one block for an input, drawn as heatmaps.

Not imported by `import kzoo` (it needs matplotlib): `import kzoo.visualization`.

Example:
>>> lm = kzoo.models.GPTCausalLM.from_preset("gpt_tiny")
>>> ids = np.array([[ord(c) for c in "To be, or not"]])
>>> weights = self_attention_weights(lm.backbone, {"token_ids": ids, "padding_mask": np.ones_like(ids)})
>>> weights.shape  # (batch, heads, queries, keys) of the last block
(1, 4, 13, 13)
>>> plot_attention(weights[0], list("To be, or not"), "attention.png")
"""

import keras
import numpy as np
from keras import ops
from matplotlib.figure import Figure

from kzoo import files
from kzoo.layers import TransformerDecoderBlock


def self_attention_weights(backbone, inputs, layer=-1):
    """The self-attention weights of one block of a kzoo backbone for `inputs`.

    Runs the backbone up to the block, then the block's own attention layer with the masks
    the block uses (padding, and causal for a decoder block), in inference mode. The weights
    are softmax(QK^T / sqrt(d_k)) per head: row i is where position i attends, and masked
    keys get exactly 0.

    Args:
        backbone: a backbone whose blocks are in `transformer_blocks` and take
            `(x, padding_mask=...)`: `GPTBackbone` or `BertBackbone` (or a task's `.backbone`).
        inputs: the backbone's inputs, e.g. `{"token_ids", "padding_mask"}` for a GPT.
        layer: int, the index of the block in `backbone.transformer_blocks`.

    Returns:
        float32 numpy array `(B, num_heads, T, T)`.
    """
    block = backbone.transformer_blocks[layer]
    # The tensors the block receives in the backbone's graph: hidden states and padding mask.
    hidden_states, padding_mask = keras.Model(backbone.input, block.input)(inputs)  # (B, T, d), (B, T)
    x = block.self_attention_norm(hidden_states) if block.norm_first else hidden_states
    padding_mask = ops.cast(padding_mask, "bool")
    _, weights = block.self_attention(
        x,
        query_mask=padding_mask,
        value_mask=padding_mask,
        use_causal_mask=isinstance(block, TransformerDecoderBlock),
        return_attention_scores=True,
        training=False,
    )
    return ops.convert_to_numpy(ops.cast(weights, "float32"))


def plot_attention(weights, tokens, path, query_tokens=None, title=None, max_columns=2):
    """Draws attention weights as heatmaps, one per head, with the tokens on both axes.

    Args:
        weights: array `(num_heads, T_q, T_k)` (one example of `self_attention_weights`), or
            `(T_q, T_k)` for a single map.
        tokens: T_k strings, the keys (x axis), e.g. the characters or word pieces.
        path: the image file to write (PNG by its suffix).
        query_tokens: T_q strings (y axis); defaults to `tokens` (self-attention).
        title: the figure title.
        max_columns: heads per row of the figure.
    """
    weights = np.asarray(weights)
    if weights.ndim == 2:
        weights = weights[None]
    query_tokens = tokens if query_tokens is None else query_tokens
    num_heads, num_queries, num_keys = weights.shape
    if (num_queries, num_keys) != (len(query_tokens), len(tokens)):
        raise ValueError(
            f"`weights` has {num_queries} query and {num_keys} key positions; received "
            f"{len(query_tokens)} query and {len(tokens)} key tokens."
        )
    columns = min(num_heads, max_columns)
    rows = -(-num_heads // columns)
    size = 1.5 + 0.13 * max(num_keys, num_queries)  # inches: room for one tick label per token
    # A bare Figure, not pyplot: no global backend or figure state is touched.
    figure = Figure(figsize=(size * columns + 1, size * rows + 0.5), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False)
    labels = [[_visible(token) for token in part] for part in (tokens, query_tokens)]
    for head, axis in enumerate(axes.flat):
        if head >= num_heads:
            axis.axis("off")
            continue
        image = axis.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0)
        axis.set_xticks(range(num_keys), labels[0], rotation=90, fontsize=8)
        axis.set_yticks(range(num_queries), labels[1], fontsize=8)
        axis.set_xlabel("key")
        axis.set_ylabel("query")
        axis.set_title(f"head {head}")
    figure.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    if title:
        figure.suptitle(title)
    with files.atomic_file(path, mode=None) as staging:  # the format from the name's suffix
        figure.savefig(staging, dpi=100, bbox_inches="tight")


def _visible(token):
    """A tick label for a token: whitespace and control characters shown by name."""
    names = {" ": "␣", "\n": "\\n", "\t": "\\t"}
    return names.get(token, token if token.isprintable() else repr(token))
