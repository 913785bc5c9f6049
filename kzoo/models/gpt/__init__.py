from kzoo.models.gpt import gpt_hf  # noqa: F401 (registers GPT-2's Hugging Face layout)
from kzoo.models.gpt.gpt_backbone import GPTBackbone
from kzoo.models.gpt.gpt_causal_lm import GPTCausalLM
from kzoo.models.gpt.gpt_presets import GPT_PRESETS
from kzoo.models.presets import register_presets

register_presets(GPT_PRESETS)
