import keras

from kzoo.validation import check_positive_int
from kzoo.validation import check_rate
from kzoo.models.bert.bert_backbone import BertBackbone
from kzoo.models.bert.bert_backbone import bert_kernel_initializer
from kzoo.models.task import Task


@keras.saving.register_keras_serializable(package="kzoo")
class BertClassifier(Task):
    """BERT for sequence classification: one label per input sequence.

    Classifies from the pooled [CLS] representation: logits = W
    Dropout(pooled_output) + b, float32 under any dtype policy. Input: the
    backbone's inputs; output: logits `(B, num_classes)`; targets are class
    ids `(B,)`.

    Args:
        backbone: a `BertBackbone`.
        num_classes: int, number of classes.
        dropout: float in [0, 1), dropout on the pooled output.
        **kwargs: `keras.Model` arguments (`name`).

    Example:
    >>> classifier = BertClassifier.from_preset("bert_tiny", num_classes=3)
    >>> ids = keras.ops.ones((2, 16), "int32")
    >>> classifier({"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": ids}).shape
    (2, 3)

    References:
        Devlin et al., "BERT", 2019, sec. 4.1.
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
        pooled_output = backbone(inputs)["pooled_output"]  # (B, d)
        logits = self.output_dense(self.output_dropout(pooled_output))  # (B, num_classes)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

        # === Config ===
        self.num_classes = num_classes
        self.dropout = dropout

    def get_config(self):
        config = super().get_config()
        config.update(num_classes=self.num_classes, dropout=self.dropout)
        return config
