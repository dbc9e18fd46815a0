"""``jobs.api.build``'s options without a build: they are ``memlib build``'s flags, and a misspelt
one is refused before anything starts."""
from __future__ import annotations

import pytest

from jobs.api import OPTION_NAMES, BuildOptions, build, options_of
from tests.jobs.conftest import run_cli

# options of the Python call that are no flag of the same name
NOT_FLAGS = {"settings": "--set", "progress": None}


def test_every_option_is_a_flag_of_memlib_build():
    res = run_cli(["build", "--help"])
    assert res.exit_code == 0, res.output
    for name in OPTION_NAMES:
        flag = NOT_FLAGS.get(name, "--" + name.replace("_", "-"))
        assert flag is None or flag in res.output, f"{name}: no {flag} in memlib build --help"


def test_a_misspelt_option_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(TypeError, match="build\\(\\) has no option 'incremntal'; the options are: format, "):
        build(tmp_path / "missing.jsonl", tmp_path / "store", incremntal=True)
    assert not (tmp_path / "store").exists()


def test_keywords_change_the_fields_of_the_options_given():
    base = BuildOptions(format="jsonl", num_cpus=2)
    opt = options_of(base, incremental=True, num_cpus=1)
    assert (opt.format, opt.num_cpus, opt.incremental, opt.recipe) == ("jsonl", 1, True, "full")
    assert (base.num_cpus, base.incremental) == (2, False)
    assert options_of() == BuildOptions()
