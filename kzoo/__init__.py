"""kzoo: a Keras 3 / TensorFlow model zoo for transformers.

`import kzoo` registers every layer and model for `.keras` deserialization, and changes nothing
else that outlives the import: under Keras' TensorFlow backend TensorFlow is imported first and
quietly (`kzoo.logs`); under JAX or PyTorch kzoo imports no TensorFlow (only its data, training
and export modules need it), and keeps Keras' serialization from importing it, with the same
configs (`kzoo._compat.serialize_without_importing_tensorflow`). XLA's options are added where
kzoo compiles (`kzoo.config.add_xla_flags`); XLA's compiled code is kept between processes only
where `KZOO_COMPILATION_CACHE` names a folder (`kzoo.config.compilation_cache`); and only scripts
that ask for it (`kzoo.logs.quiet`) drop what C++ code writes as the process exits.
"""

__version__ = "0.1.0"

from kzoo import config
from kzoo import logs

# First, so that TensorFlow's lines at import follow TF_CPP_MIN_LOG_LEVEL (see kzoo.logs); under
# another backend the layers, models and Hugging Face loader run without TensorFlow installed.
if config.keras_backend() == "tensorflow":
    logs.import_tensorflow()
else:
    from kzoo import _compat

    # Keras' serialization (any `get_config`) imports TensorFlow wherever it is installed.
    _compat.serialize_without_importing_tensorflow()
config.use_compilation_cache()  # where KZOO_COMPILATION_CACHE names a folder

from kzoo import layers  # noqa: E402
from kzoo import models  # noqa: E402
from kzoo import ops  # noqa: E402
from kzoo import samplers  # noqa: E402
