from kzoo.models.bert import bert_hf  # noqa: F401 (registers BERT's Hugging Face layout)
from kzoo.models.bert.bert_backbone import BertBackbone
from kzoo.models.bert.bert_classifier import BertClassifier
from kzoo.models.bert.bert_masked_lm import BertMaskedLM
from kzoo.models.bert.bert_presets import BERT_PRESETS
from kzoo.models.bert.bert_token_classifier import BertTokenClassifier
from kzoo.models.presets import register_presets

register_presets(BERT_PRESETS)
