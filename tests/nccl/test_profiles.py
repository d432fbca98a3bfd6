"""Every profile composes, documents each variable it sets, and agrees with auto's tuning."""

import pytest

from toolkit.config.compose import compose_raw, group_options, to_job
from toolkit.config.nccl import NcclConfig
from toolkit.config.sources import package_conf_dir
from toolkit.nccl.detect import FABRIC_TUNING


def test_the_profiles_are_the_documented_ones():
    assert group_options("nccl") == sorted(NcclConfig.PROFILES)


@pytest.mark.parametrize("profile", NcclConfig.PROFILES)
def test_profile_composes_and_names_itself(profile):
    job = to_job(compose_raw([f"nccl={profile}"]))
    assert job.nccl.profile == profile
    if profile == "auto":
        assert job.nccl.profile_env == {}
    else:
        # nccl=auto applies exactly the same static tuning once it has detected the fabric
        assert job.nccl.profile_env == FABRIC_TUNING[profile]


@pytest.mark.parametrize("profile", NcclConfig.PROFILES)
def test_every_variable_a_profile_sets_has_a_comment_above_it(profile):
    lines = (package_conf_dir() / "nccl" / f"{profile}.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("  NCCL_"):
            assert lines[i - 1].lstrip().startswith("#"), (
                f"{profile}.yaml: {line.strip()} is undocumented"
            )


def test_auto_is_the_default():
    assert to_job(compose_raw([])).nccl.profile == "auto"
