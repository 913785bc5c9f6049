import gc
import math
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402

WORKERS_PER_CORE = 1.5


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: WORKERS_PER_CORE workers per core. Much of a test's time is single-threaded
    (tracing Keras layers into graphs, starting subprocesses, waiting on them), so one worker
    per core leaves cores idle. PYTEST_XDIST_AUTO_NUM_WORKERS still overrides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return math.ceil(WORKERS_PER_CORE * cores)


# The longest tests (a minute or more each on 2 cores), started first: xdist hands tests out in
# order, and one of these started last keeps a worker busy long after the others are done.
LONGEST_FIRST = (
    "tests/test_docs.py::test_readme_examples_run",
    "tests/recipes/test_chat_finetune.py::test_translation_scores_greedy_replies_with_bleu",
    "tests/training/test_distributed_fit.py::test_a_killed_run_resumes",
    "tests/recipes/test_resume.py::test_a_killed_recipe_reruns",
    "tests/recipes/test_lm_compare.py",
    "tests/export/test_quiet.py",
)


def pytest_collection_modifyitems(config, items):
    """The longest tests first; tests marked `slow` run only with KZOO_SLOW=1 (the README says which)."""
    items.sort(key=lambda item: not item.nodeid.startswith(LONGEST_FIRST))  # stable: the rest keep their order
    if os.environ.get("KZOO_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set KZOO_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# Every this many tests, a worker also collects the objects it froze (below).
FULL_COLLECTION_EVERY = 100
_tests_since_full_collection = 0


@pytest.fixture(autouse=True)
def _reset_keras_state():
    """Each test starts from a fixed seed, the float32 policy and fresh Keras state (layer names,
    TensorFlow's default graph).

    After each test its garbage is collected and what is left is frozen (`gc.freeze`): Python's
    full collections walk every tracked object, and a worker holds over a million (the modules
    of TensorFlow, Keras, transformers and torch, earlier tests' traced functions), which made a
    test late in a worker two to three times slower than in a fresh one. Frozen objects are
    never walked again, so each collection sees one test's objects. Every
    FULL_COLLECTION_EVERY tests the frozen objects are collected too, so that the cyclic garbage
    of finished modules (their fixtures' models) is freed."""
    global _tests_since_full_collection
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session(free_memory=False)
    _tests_since_full_collection += 1
    if _tests_since_full_collection >= FULL_COLLECTION_EVERY:
        _tests_since_full_collection = 0
        gc.unfreeze()
    gc.collect()
    gc.freeze()
