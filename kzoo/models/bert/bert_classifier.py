import keras
import numpy as np

from kzoo.models.bert.bert_classifier_base import BertClassifierBase


@keras.saving.register_keras_serializable(package="kzoo")
class BertClassifier(BertClassifierBase):
    """BERT for sequence classification: one label per input sequence.

    Classifies from the pooled [CLS] representation: logits = W
    Dropout(pooled_output) + b, float32 under any dtype policy. Input: the
    backbone's inputs; output: logits `(B, num_classes)`; targets are class
    ids `(B,)`.

    With a `tokenizer` (`kzoo.models.Task`), `predict` takes raw strings and
    returns their class ids.

    Args:
        backbone: a `BertBackbone`.
        num_classes: int, number of classes.
        dropout: float in [0, 1), dropout on the pooled output.
        **kwargs: `kzoo.models.Task` arguments (`tokenizer`) and `keras.Model`
            ones (`name`).

    Example:
    >>> classifier = BertClassifier.from_preset("bert_tiny", num_classes=3)
    >>> ids = keras.ops.ones((2, 16), "int32")
    >>> tuple(classifier({"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": ids}).shape)
    (2, 3)

    References:
        Devlin et al., "BERT", 2019, sec. 4.1.
    """

    backbone_output = "pooled_output"

    def predictions_from_outputs(self, outputs):
        """Labels for `predict` on raw strings: the class ids of the largest logits."""
        return np.argmax(outputs, axis=-1)
