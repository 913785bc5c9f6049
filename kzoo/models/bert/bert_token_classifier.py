import keras

from kzoo.validation import check_positive_int
from kzoo.validation import check_rate
from kzoo.models.bert.bert_backbone import BertBackbone
from kzoo.models.bert.bert_backbone import bert_kernel_initializer
from kzoo.models.task import Task


@keras.saving.register_keras_serializable(package="kzoo")
class BertTokenClassifier(Task):
    """BERT for token classification (tagging): one label per input token.

    Classifies each token from its top hidden state: logits_t = W
    Dropout(h_t) + b, float32 under any dtype policy (as for named-entity
    recognition in the BERT paper). Input: the backbone's inputs; output:
    logits `(B, T, num_classes)`; targets are class ids `(B, T)`. Give padded
    tokens (and word-piece continuations, if only first pieces are labelled)
    sample weight 0.

    Args:
        backbone: a `BertBackbone`.
        num_classes: int, number of classes.
        dropout: float in [0, 1), dropout on the hidden states.
        **kwargs: `keras.Model` arguments (`name`).

    Example:
    >>> tagger = BertTokenClassifier.from_preset("bert_tiny", num_classes=3)
    >>> ids = keras.ops.ones((2, 16), "int32")
    >>> tagger({"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": ids}).shape
    (2, 16, 3)

    References:
        Devlin et al., "BERT", 2019, sec. 5.3 (CoNLL-2003 NER).
    """

    backbone_cls = BertBackbone
    default_learning_rate = 5e-5

    def __init__(self, backbone, num_classes, dropout=0.1, **kwargs):
        if not isinstance(backbone, BertBackbone):
            raise ValueError(f"`backbone` must be a BertBackbone; received {type(backbone).__name__}.")
        check_positive_int("num_classes", num_classes)
        check_rate("dropout", dropout)
        # === Layers ===
        self.backbone = backbone
        self.output_dropout = keras.layers.Dropout(dropout, dtype=backbone.dtype_policy, name="output_dropout")
        self.output_dense = keras.layers.Dense(
            num_classes, kernel_initializer=bert_kernel_initializer(), dtype="float32", name="logits"
        )

        # === Functional model ===
        inputs = backbone.input
        sequence_output = backbone(inputs)["sequence_output"]  # (B, T, d)
        logits = self.output_dense(self.output_dropout(sequence_output))  # (B, T, num_classes)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

        # === Config ===
        self.num_classes = num_classes
        self.dropout = dropout

    def get_config(self):
        config = super().get_config()
        config.update(num_classes=self.num_classes, dropout=self.dropout)
        return config
