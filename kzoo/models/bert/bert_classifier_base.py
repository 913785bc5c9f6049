import keras

from kzoo.models.bert.bert_backbone import BertBackbone
from kzoo.models.bert.bert_backbone import bert_kernel_initializer
from kzoo.models.task import Task
from kzoo.validation import check_positive_int
from kzoo.validation import check_rate


class BertClassifierBase(Task):
    """BERT with a linear head on one of its outputs: logits = W Dropout(h) + b, float32.

    The base of `BertClassifier` (h = the pooled [CLS] output, one label per
    sequence) and `BertTokenClassifier` (h = each token's top hidden state);
    a subclass sets `backbone_output`.

    Args:
        backbone: a `BertBackbone`.
        num_classes: int, number of classes.
        dropout: float in [0, 1), dropout on h.
        **kwargs: `keras.Model` arguments (`name`).
    """

    backbone_cls = BertBackbone
    default_learning_rate = 5e-5
    backbone_output = None  # "pooled_output" or "sequence_output"

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
        hidden = backbone(inputs)[self.backbone_output]  # (B, d) or (B, T, d)
        logits = self.output_dense(self.output_dropout(hidden))  # (B, [T,] num_classes)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

        # === Config ===
        self.num_classes = num_classes
        self.dropout = dropout

    def get_config(self):
        config = super().get_config()
        config.update(num_classes=self.num_classes, dropout=self.dropout)
        return config
