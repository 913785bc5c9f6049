"""Where `MultiWorkerTrainerMixin` (the fix of Keras's trainer under `MultiWorkerMirroredStrategy`,
keras#20585) was defined; it overrides private trainer methods, so it now lives in `kzoo._compat`
with the other uses of private APIs. Kept importable from here.
"""

from kzoo._compat import MultiWorkerTrainerMixin  # noqa: F401
from kzoo._compat import in_multi_worker_mode  # noqa: F401
