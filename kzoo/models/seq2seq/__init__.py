from kzoo.models.presets import register_presets
from kzoo.models.seq2seq.seq2seq_backbone import Seq2SeqBackbone
from kzoo.models.seq2seq.seq2seq_presets import SEQ2SEQ_PRESETS
from kzoo.models.seq2seq.seq2seq_transformer import Seq2SeqTransformer

register_presets(SEQ2SEQ_PRESETS)
