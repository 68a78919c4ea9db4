"""The default attention builds keep their SASS (tests/sass_catalogue.py): a refactor that means
no change to code generation must leave every hash of tests/fixtures/sass_defaults.json as it is.
The builds are tests/builds.py's (the catalogue's compile, once per session), shared with the
compile tests that read the same configs' SASS."""
import pytest

import builds as B
import sass_catalogue as cat

BUILDS = sorted(cat.builds())


@pytest.mark.compile
@pytest.mark.parametrize("name", BUILDS)
def test_default_build_sass_unchanged(name):
    want = cat.load_fixture()[name]
    plan = cat.plan_of(cat.builds()[name])
    got = {"fwd": cat.sass_hash(B.fwd(plan.fwd).sass), "bwd": cat.sass_hash(B.bwd(plan.bwd).sass)}
    assert got == want, (f"{name}: SASS changed {want} -> {got}; if the change means to alter code "
                         "generation, regenerate the fixture (python tests/sass_catalogue.py --write) "
                         "and say which builds moved and why")
