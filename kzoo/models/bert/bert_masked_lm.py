import keras
from keras import ops

from kzoo.layers import LayerNormalization
from kzoo.models.bert.bert_backbone import BertBackbone
from kzoo.models.bert.bert_backbone import bert_kernel_initializer
from kzoo.models.perplexity import Perplexity
from kzoo.models.task import Task
from kzoo.models.tied_logits import TiedLogits
from kzoo.ops import get_activation


@keras.saving.register_keras_serializable(package="kzoo")
class BertMaskedLM(Task):
    """BERT's masked language model: predicts the tokens at masked positions.

    The hidden states at `mask_positions` go through BERT's transform (dense,
    the backbone's activation and LayerNorm epsilon) and the output projection tied to the token table plus
    a per-token bias (keras-hub's `MaskedLMHead` structure):

        z = LayerNorm(gelu(W h_i + b))
        logits_i = E z + b_out      (float32)

    Inputs: the backbone's inputs plus `"mask_positions"` `(B, M)` int, the
    indices of the M masked tokens per sequence. Output: logits `(B, M, V)`.
    Train with `y` = the original ids at those positions and `sample_weight`
    = 1 for real masks, 0 for the padding of `mask_positions`.

    Args:
        backbone: a `BertBackbone`.
        **kwargs: `keras.Model` arguments (`name`).

    Example:
    >>> mlm = BertMaskedLM.from_preset("bert_tiny")
    >>> ids = keras.ops.ones((2, 16), "int32")
    >>> logits = mlm({"token_ids": ids, "segment_ids": 0 * ids,
    ...               "padding_mask": ids, "mask_positions": ids[:, :3]})
    >>> tuple(logits.shape)
    (2, 3, 30522)

    References:
        Devlin et al., "BERT", 2019, sec. 3.1 (Task #1: Masked LM).
    """

    backbone_cls = BertBackbone
    default_learning_rate = 1e-4

    def __init__(self, backbone, **kwargs):
        if not isinstance(backbone, BertBackbone):
            raise ValueError(f"`backbone` must be a BertBackbone; received {type(backbone).__name__}.")
        dtype = backbone.dtype_policy
        # === Layers ===
        self.backbone = backbone
        self.transform_dense = keras.layers.Dense(
            backbone.hidden_dim,
            kernel_initializer=bert_kernel_initializer(),
            dtype=dtype,
            name="transform_dense",
        )
        self.transform_norm = LayerNormalization(
            epsilon=backbone.layer_norm_epsilon, dtype=dtype, name="transform_norm"
        )
        self.lm_head = TiedLogits(backbone.embedding, use_bias=True, dtype=dtype, name="lm_head")

        # === Functional model ===
        inputs = {
            **backbone.input,
            "mask_positions": keras.Input(shape=(None,), dtype="int32", name="mask_positions"),
        }
        sequence_output = backbone({key: inputs[key] for key in backbone.input})["sequence_output"]
        # expand_dims, not [..., None]: see `kzoo.layers.masks.merge_masks` (TFLite).
        x = ops.take_along_axis(sequence_output, ops.expand_dims(inputs["mask_positions"], -1), axis=1)  # (B, M, d)
        x = self.transform_norm(get_activation(backbone.activation)(self.transform_dense(x)))
        logits = self.lm_head(x)  # (B, M, V) float32
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

    def default_metrics(self):
        return super().default_metrics() + [Perplexity()]
