"""kzoo: a Keras 3 / TensorFlow model zoo for transformers.

`import kzoo` registers every layer and model for `.keras` deserialization. It imports Keras
and TensorFlow without their log lines unless `TF_CPP_MIN_LOG_LEVEL` is set (`kzoo.logs`).
"""

__version__ = "0.1.0"

from kzoo import logs

logs.quiet()

from kzoo import config  # noqa: E402
from kzoo import layers  # noqa: E402
from kzoo import models  # noqa: E402
from kzoo import ops  # noqa: E402
from kzoo import samplers  # noqa: E402
