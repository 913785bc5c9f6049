from kzoo.models.rnn.bilstm_classifier import BiLSTMClassifier
from kzoo.models.rnn.bilstm_tagger import BiLSTMTagger
from kzoo.models.rnn.rnn_language_model import RNNLanguageModel
