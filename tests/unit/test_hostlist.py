from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.spec.hostlist import HostlistError, compress, expand


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("gpu[001-003]", ["gpu001", "gpu002", "gpu003"]),
        ("gpu[1-3,7]", ["gpu1", "gpu2", "gpu3", "gpu7"]),
        ("10.0.0.[11-13]", ["10.0.0.11", "10.0.0.12", "10.0.0.13"]),
        ("r[1-2]-n[01-02]", ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("single", ["single"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
    ],
)
def test_expand(expr: str, want: list[str]) -> None:
    assert expand(expr) == want


@pytest.mark.parametrize(
    "bad", ["", "gpu[", "gpu]", "gpu[3-1]", "gpu[a-b]", "gpu[]", "gpu[[1-2]]", "a,,b", "x[1-99999999]"]
)
def test_expand_rejects(bad: str) -> None:
    with pytest.raises(HostlistError):
        expand(bad)


def test_compress_roundtrip_known() -> None:
    assert compress(expand("gpu[001-128]")) == "gpu[001-128]"
    assert compress(["a", "n1", "n2", "n4"]) == "a,n[1-2],n4"


@given(
    st.lists(st.integers(min_value=0, max_value=999), min_size=1, max_size=40, unique=True),
    st.sampled_from(["gpu", "node-", "r1n"]),
    st.integers(min_value=1, max_value=4),
)
def test_compress_expand_roundtrip(nums: list[int], prefix: str, width: int) -> None:
    names = [f"{prefix}{str(n).zfill(width)}" for n in sorted(nums)]
    assert expand(compress(names)) == names
