import keras

from kzoo.models.decoder.causal_lm import CausalLM
from kzoo.models.gpt.gpt_backbone import GPTBackbone


@keras.saving.register_keras_serializable(package="kzoo")
class GPTCausalLM(CausalLM):
    """A GPT language model: a `GPTBackbone` with the tied output projection.

    Predicts each next token: P(w_{t+1} | w_<=t) = softmax(E h_t), where h_t
    is the backbone's top hidden state and E the token embedding table
    shared with the input (no separate output matrix, no bias, as in GPT-2).
    Everything else (training, `prefill` / `decode`, `generate`) is
    `CausalLM`'s.

    Args:
        backbone: a `GPTBackbone`.
        **kwargs: `keras.Model` arguments (`name`, `tokenizer`).

    Example:
    >>> lm = GPTCausalLM.from_preset("gpt_tiny")
    >>> ids = keras.ops.ones((1, 8), "int32")
    >>> tuple(lm({"token_ids": ids, "padding_mask": keras.ops.ones_like(ids)}).shape)
    (1, 8, 256)
    """

    backbone_cls = GPTBackbone
