"""LiteRT-LM bundles (`.litertlm`) of kzoo causal language models, verified in the runtime.

A bundle, packed with `litert-lm-builder`, holds three sections:

- the TFLite model in the runtime's conventions (`signatures`: `prefill_<N>` and `decode`,
  the KV cache as `kv_cache_k_<i>` / `kv_cache_v_<i>`);
- the tokenizer as a Hugging Face `tokenizer.json` (`kzoo.tokenizers.tokenizer_json`);
- `LlmMetadata`: start token, stop tokens, `max_num_tokens` (the cache length), the
  default sampler and, for a tokenizer with a chat template, that template as the runtime's
  conversations render it (`runtime_chat_template`).

`bundle` makes what goes in (the model in one of `CONVERSIONS`, the metadata) and packs the
file; `verification` checks a bundle in the runtime against Keras (`Bundles`).
"""

from kzoo.export.litertlm.bundle import CONVERSIONS
from kzoo.export.litertlm.bundle import Sampler
from kzoo.export.litertlm.bundle import bundle_model
from kzoo.export.litertlm.bundle import llm_metadata
from kzoo.export.litertlm.bundle import runtime_chat_template
from kzoo.export.litertlm.bundle import write_bundle
from kzoo.export.litertlm.signatures import DEFAULT_PREFILL_LENGTHS
from kzoo.export.litertlm.signatures import TEACHER_FORCED
from kzoo.export.litertlm.signatures import RuntimeSignatures
from kzoo.export.litertlm.signatures import attention_spans
from kzoo.export.litertlm.signatures import prefill_lengths
from kzoo.export.litertlm.signatures import runtime_name
from kzoo.export.litertlm.verification import Bundles
from kzoo.export.tflite.graph_passes import embedding_lookups
from kzoo.export.tflite.quantize import INT4
from kzoo.export.tflite.quantize import INT4_BLOCK
from kzoo.export.tflite.quantize import INT8
from kzoo.export.tflite.quantize import int4_problem
from kzoo.export.tflite.quantize import quantize
