"""VirtualTensorize's options are validated: a typo is an error, not a silently disabled pass."""

import pytest
from tvm import relax

import vtc_tvm
from tests.conftest import make_module


def _transpose_matmul():
    return make_module([((4, 8), "float32"), ((4, 5), "float32")],
                       lambda x, w: relax.op.matmul(relax.op.permute_dims(x), w))


def test_unknown_op_name():
    with pytest.raises(ValueError, match=r"ops: 'relax.permute_dim' has no VirtualTensorize rule "
                                         r"\(did you mean 'relax.permute_dims'\?\)"):
        vtc_tvm.VirtualTensorize(ops=["relax.permute_dim"])
    with pytest.raises(TypeError, match="not the string 'relax.concat'"):
        vtc_tvm.VirtualTensorize(ops="relax.concat")


def test_short_op_names_are_accepted():
    """``permute_dims`` means ``relax.permute_dims``: the edge is taken as with the full name."""
    mod = _transpose_matmul()
    for ops in (["permute_dims"], ["relax.permute_dims"]):
        report = []
        vtc_tvm.VirtualTensorize(strategy="all", ops=ops, report=report)(mod)
        assert [d["virtual"] for d in report] == [True], report
    report = []
    vtc_tvm.VirtualTensorize(strategy="all", ops=["concat"], report=report)(mod)
    assert report == []  # permute_dims not allowed: not even considered


def test_report_must_support_append():
    with pytest.raises(TypeError, match="report must be a list .* not str"):
        vtc_tvm.VirtualTensorize(report="x")
    vtc_tvm.VirtualTensorize(report=[])  # fine


def test_inplace_names_are_checked_at_pass_time():
    mod = _transpose_matmul()
    with pytest.raises(TypeError, match="not the string 'x0'"):
        vtc_tvm.VirtualTensorize(inplace="x0")
    with pytest.raises(ValueError, match=r"inplace: 'x2' is not a parameter .*parameters: x0, x1"):
        vtc_tvm.VirtualTensorize(inplace=["x2"])(mod)
    vtc_tvm.VirtualTensorize(inplace=["x1"])(mod)  # a parameter: fine (nothing to update here)
