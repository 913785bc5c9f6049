import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Tests marked `slow` run only with KZOO_SLOW=1 (the README says which)."""
    if os.environ.get("KZOO_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set KZOO_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _reset_keras_state():
    """Each test starts from a fixed seed and the float32 policy."""
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session()
