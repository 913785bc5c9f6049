"""Backbones, task models and presets built from `kzoo.layers`.

Importing this package registers every model class (for `.keras` loading)
and every preset (for `from_preset`).
"""

from kzoo.models.backbone import Backbone
from kzoo.models.bert import BertBackbone
from kzoo.models.bert import BertClassifier
from kzoo.models.bert import BertMaskedLM
from kzoo.models.bert import BertTokenClassifier
from kzoo.models.cross_entropy import TokenCrossEntropy
from kzoo.models.cross_entropy import token_cross_entropy
from kzoo.models.decoder import CausalLM
from kzoo.models.decoder import DecoderBackbone
from kzoo.models.decoder import PromptLookup
from kzoo.models.decoder import ReplyLogits
from kzoo.models.feed_forward import FeedForwardLanguageModel
from kzoo.models.gpt import GPTBackbone
from kzoo.models.gpt import GPTCausalLM
from kzoo.models.perplexity import Perplexity
from kzoo.models.presets import PRESETS
from kzoo.models.presets import list_presets
from kzoo.models.presets import register_presets
from kzoo.models.rnn import BiLSTMClassifier
from kzoo.models.rnn import BiLSTMTagger
from kzoo.models.rnn import RNNLanguageModel
from kzoo.models.seq2seq import Seq2SeqBackbone
from kzoo.models.seq2seq import Seq2SeqTransformer
from kzoo.models.task import StandaloneTask
from kzoo.models.task import Task
from kzoo.models.task import warmup_then_decay
from kzoo.models.tied_logits import TiedLogits
