"""The test tiers (`tests/conftest.py`): every test is in exactly one, and `--tier` runs what it names."""

import copy
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest

TESTS = Path(__file__).parent
ROOT = TESTS.parent


class Item:
    """What the tier rules read of a collected test, and what they write to it."""

    def __init__(self, path, name, marks=(), fixtures=()):
        self.path = ROOT / path
        self.name = self.originalname = name
        self.nodeid = f"{path}::{name}"
        self.config = SimpleNamespace(rootpath=ROOT)
        self.fixturenames = list(fixtures)
        self.marks = [getattr(pytest.mark, mark) for mark in marks]
        self.user_properties = []

    def get_closest_marker(self, name):
        return next((mark.mark for mark in self.marks if mark.name == name), None)

    def add_marker(self, mark):
        self.marks.append(mark)

    def skip_reason(self):
        return next((mark.kwargs["reason"] for mark in self.marks if mark.name == "skip"), None)


# One test of each way a tier comes about, and the tier it gets.
ITEMS = {
    Item("tests/layers/test_plain.py", "test_a_layer"): "fast",
    Item("tests/test_peers.py", "test_a_pytorch_only_folder_is_named"): "fast",
    Item("tests/test_peers.py", "test_logits_match_transformers"): "parity",
    Item("tests/test_peers.py", "test_marked_on_its_module", marks=["parity"]): "parity",
    Item("tests/recipes/test_recipe.py", "test_a_recipe_runs"): "e2e",
    Item("tests/test_docs.py", "test_readme_examples_run"): "e2e",
    Item("tests/elsewhere/test_smollm2.py", "test_a_module_moved_keeps_its_tier"): "e2e",
    Item("tests/test_real.py", "test_the_real_file_reads", fixtures=["tmp_path", "smollm2_reader"]): "e2e",
    Item("tests/models/test_x.py", "test_keras_round_trip_in_a_fresh_process"): "e2e",
    Item("tests/test_long.py", "test_long_and_named_for_keras_hub", marks=["slow", "e2e"]): "slow",
}


def config(tier, kzoo_slow=None, monkeypatch=None):
    if kzoo_slow:
        monkeypatch.setenv("KZOO_SLOW", kzoo_slow)
    else:
        monkeypatch.delenv("KZOO_SLOW", raising=False)
    return SimpleNamespace(getoption=lambda name: tier)


@pytest.mark.parametrize("item, tier", ITEMS.items(), ids=[item.name for item in ITEMS])
def test_each_rule_gives_its_tier(item, tier):
    assert conftest.tier_of(item) == tier


@pytest.mark.parametrize(
    "option, kzoo_slow, tiers",
    [
        ("fast", None, {"fast"}),
        ("parity", None, {"parity"}),
        ("e2e, parity", None, {"e2e", "parity"}),
        ("all", None, {"fast", "parity", "e2e"}),
        ("all", "1", {"fast", "parity", "e2e", "slow"}),
        ("fast", "0", {"fast"}),
        ("slow", None, {"slow"}),
    ],
)
def test_the_tier_option_runs_the_tiers_it_names_and_skips_the_rest_naming_the_option(
    option, kzoo_slow, tiers, monkeypatch
):
    cases = [(copy.deepcopy(item), tier) for item, tier in ITEMS.items()]
    conftest.pytest_collection_modifyitems(config(option, kzoo_slow, monkeypatch), [item for item, _ in cases])
    for item, tier in cases:
        assert item.user_properties == [("tier", tier)]
        reason = item.skip_reason()
        if tier in tiers:
            assert reason is None, item.nodeid
        else:
            assert reason == (
                "slow tier: set KZOO_SLOW=1"
                if tier == "slow"
                else f"{tier} tier: run with --tier {tier} (or --tier all)"
            )


def test_an_unknown_tier_is_refused_naming_the_choices(monkeypatch):
    with pytest.raises(pytest.UsageError, match="fast, parity, e2e, slow, all, got 'fats'"):
        conftest.selected_tiers(config("fast,fats", monkeypatch=monkeypatch))


def test_a_test_marked_with_two_tiers_is_refused():
    with pytest.raises(pytest.UsageError, match="marked parity and e2e: a test has one tier"):
        conftest.tier_of(Item("tests/test_x.py", "test_both", marks=["parity", "e2e"]))


def test_every_collected_test_has_one_tier_and_runs_only_if_selected(request):
    """Over the tests this run collected: the whole suite in a plain run."""
    selected = conftest.selected_tiers(request.config)
    for item in request.session.items:
        tiers = [value for key, value in item.user_properties if key == "tier"]
        assert len(tiers) == 1 and tiers[0] in conftest.TIERS, (item.nodeid, tiers)
        skipped_for_tier = any(
            mark.kwargs.get("reason", "").startswith(f"{tiers[0]} tier:") for mark in item.iter_markers("skip")
        )
        assert skipped_for_tier == (tiers[0] not in selected), item.nodeid


def test_the_tier_table_names_folders_modules_and_tests_that_exist():
    """A module renamed or a test removed would otherwise leave its entry matching nothing."""
    for entries in conftest.TIER_TABLE.values():
        for entry in entries:
            if entry.endswith("/"):
                assert any(TESTS.rglob(entry.rstrip("/"))), entry
                continue
            module, _, test = entry.partition("::")
            paths = list(TESTS.rglob(module))
            assert len(paths) == 1, f"{entry}: {len(paths)} modules named {module}"
            if test:
                assert re.search(rf"^def {test}\(", paths[0].read_text(), re.MULTILINE), entry
