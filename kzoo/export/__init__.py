"""Export for serving: SavedModel and TFLite files of kzoo models, verified against Keras.

TensorFlow only. `export(model_or_path, output_dir)` writes, into a temporary folder that
is moved into place only when every check passed:

- `savedmodel/`: signatures `serving_default` (logits / class probabilities / tags, dynamic
  batch and length) and, for `GPTCausalLM` and `Seq2SeqTransformer`, `generate` (greedy, a
  compiled loop over the KV cache), each variable stored once; with the model's tokenizer
  saved beside it, `classify_text` (classifiers) or `generate_text` (GPT, seq2seq) on raw strings;
- `model_fp32.tflite`, `model_fp16.tflite`, `model_int8_dynamic.tflite`: builtin ops only,
  with `prefill`/`decode` signatures (the KV cache as explicit state) for generation, and on
  request the full integer `model_int8.tflite`, calibrated on representative data;
- `export_report.json`: sizes, max abs differences from Keras at lengths 1, 7 and full,
  quality deltas of the quantized files, and median batch-1 latencies.

`ServingSignatures` traces the signatures; `LiteRTModel` runs the TFLite files (it needs only
NumPy and `ai_edge_litert`); `python export/export.py MODEL.keras --out DIR` is the command line.

For a causal LM with its tokenizer, also `model.litertlm` and `model_int8.litertlm`: bundles
for Google's LiteRT-LM runtime (`kzoo.export.litertlm`, signatures `RuntimeSignatures`),
checked in that runtime; `LiteRTLMModel` runs them (it needs only `litert-lm-api` and
`litert-lm-builder`).

Example:
>>> report = kzoo.export.export("runs/gpt/model.keras", "runs/gpt/export")
>>> lm = kzoo.export.LiteRTModel("runs/gpt/export/model_fp32.tflite")
>>> lm.generate([72, 105], max_length=32)
"""

from kzoo.export import verification
from kzoo.export.exporter import DEFAULT_FORMATS
from kzoo.export.exporter import FORMATS
from kzoo.export.exporter import REPORT_FILE
from kzoo.export.exporter import ExportError
from kzoo.export.exporter import export
from kzoo.export.formats import tflite_file_name
from kzoo.export.litert_model import LiteRTModel
from kzoo.export.litertlm import RuntimeSignatures
from kzoo.export.litertlm_model import LiteRTLMModel
from kzoo.export.serving_signatures import ServingSignatures
from kzoo.export.tflite.convert import TFLITE_FORMATS
from kzoo.export.verification import FP32_TOLERANCE
from kzoo.export.verification import QUALITY_BOUNDS
