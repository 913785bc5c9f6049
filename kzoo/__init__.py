"""kzoo: a Keras 3 / TensorFlow model zoo for transformers.

`import kzoo` registers every layer and model for `.keras` deserialization.
"""

__version__ = "0.1.0"

from kzoo import config
from kzoo import layers
from kzoo import models
from kzoo import ops
from kzoo import samplers
