from kzoo.models.gpt.gpt_backbone import GPTBackbone
from kzoo.models.gpt.gpt_causal_lm import GPTCausalLM
from kzoo.models.gpt.gpt_presets import GPT_PRESETS
from kzoo.models.presets import register_presets

register_presets(GPT_PRESETS)
