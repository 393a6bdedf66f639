"""The original's client-level keyed-state options (state_cache_dir,
state_owned_cache_size, state_read_cache_size, state_recovery_delay):
accepted in its forms, refused with the option's name otherwise."""
from datetime import timedelta

import pytest

from prosody import ProsodyClient


def make(**options):
    return ProsodyClient(mock=True, group_id="g", **options)


def test_accepts_the_original_forms():
    make(state_owned_cache_size="64 MiB", state_read_cache_size="500 MB",
         state_cache_dir="/tmp/prosody-state", state_recovery_delay=timedelta(seconds=30))
    make(state_read_cache_size=4096, state_recovery_delay=45)


@pytest.mark.parametrize("bad", ["0", "-1 MiB", "nonsense", -1])
@pytest.mark.parametrize("option", ["state_owned_cache_size", "state_read_cache_size"])
def test_rejects_bad_sizes(option, bad):
    with pytest.raises(ValueError, match=option):
        make(**{option: bad})


@pytest.mark.parametrize("option", ["state_owned_cache_size", "state_read_cache_size"])
def test_rejects_a_bool_size(option):
    with pytest.raises(TypeError, match=option):
        make(**{option: True})


@pytest.mark.parametrize("bad", [1.5, -30, float("nan"), timedelta(milliseconds=1500)])
def test_rejects_recovery_delays_not_whole_positive_seconds(bad):
    with pytest.raises(ValueError, match="state_recovery_delay"):
        make(state_recovery_delay=bad)
