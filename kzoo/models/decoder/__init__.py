from kzoo.models.decoder import decoder_hf  # noqa: F401 (registers the Llama lineage's Hugging Face layouts)
from kzoo.models.decoder.causal_lm import CausalLM
from kzoo.models.decoder.decoder_backbone import DecoderBackbone
from kzoo.models.decoder.decoder_presets import DECODER_PRESETS
from kzoo.models.decoder.reply_logits import ReplyLogits
from kzoo.models.decoder.speculative import PromptLookup
from kzoo.models.presets import register_presets

register_presets(DECODER_PRESETS)
