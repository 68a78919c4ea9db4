"""The default attention builds keep their SASS (tests/sass_catalogue.py): a refactor that means
no change to code generation must leave every hash of tests/fixtures/sass_defaults.json as it is."""
import pytest

import sass_catalogue as cat

BUILDS = sorted(cat.builds())


@pytest.mark.compile
@pytest.mark.parametrize("name", BUILDS)
def test_default_build_sass_unchanged(name):
    want = cat.load_fixture()[name]
    call = cat.builds()[name]
    got = {"fwd": cat.sass_hash(cat.sass_text(cat.fwd_kernel(call))),
           "bwd": cat.sass_hash(cat.sass_text(cat.bwd_kernel(call)))}
    assert got == want, (f"{name}: SASS changed {want} -> {got}; if the change means to alter code "
                         "generation, regenerate the fixture (python tests/sass_catalogue.py --write) "
                         "and say which builds moved and why")
