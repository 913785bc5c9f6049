import keras

from kzoo.models.bert.bert_classifier_base import BertClassifierBase


@keras.saving.register_keras_serializable(package="kzoo")
class BertTokenClassifier(BertClassifierBase):
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
    >>> tuple(tagger({"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": ids}).shape)
    (2, 16, 3)

    References:
        Devlin et al., "BERT", 2019, sec. 5.3 (CoNLL-2003 NER).
    """

    backbone_output = "sequence_output"
