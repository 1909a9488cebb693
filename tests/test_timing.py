"""benchmarks.timing: one timing function for TVM and torch (CPU checks; the GPU side is
benchmarks/peer_check.py on the device)."""

import math

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax import op as R

from benchmarks.timing import copies_for, rotation, time_callable, time_interleaved


def _vm():
    x = relax.Var("x", relax.TensorType((16, 32), "float32"))
    w = relax.Var("w_0", relax.TensorType((32, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(R.matmul(x, w))
        bb.emit_func_output(out)
    ex = tvm.compile(bb.get(), tvm.target.Target("llvm"))
    return relax.VirtualMachine(ex, tvm.cpu())


def _arrays():
    rng = np.random.default_rng()
    return [rng.standard_normal((16, 32)).astype("float32"), rng.standard_normal((32, 8)).astype("float32")]


def test_rotation_copies_activations_and_shares_weights():
    arrays = _arrays()
    sets = rotation(arrays, lambda a: tvm.runtime.tensor(a, tvm.cpu()), shared=[False, True], device="cpu",
                    max_copies=4)
    assert len(sets) == 4  # 2 KiB of activations: capped at max_copies
    assert all(s[1] is sets[0][1] for s in sets)  # one copy of the weight
    assert len({id(s[0]) for s in sets}) == 4
    for s in sets:
        np.testing.assert_array_equal(s[0].numpy(), arrays[0])
    sets[0][0].copyfrom(np.zeros((16, 32), "float32"))  # distinct buffers: the others keep their values
    np.testing.assert_array_equal(sets[1][0].numpy(), arrays[0])
    assert copies_for(10, 100) == 20 and copies_for(300, 100) == 1 and copies_for(1, 100, max_copies=8) == 8


def test_time_callable_tvm_vm():
    vm = _vm()
    arrays = _arrays()
    sets = rotation(arrays, lambda a: tvm.runtime.tensor(a, tvm.cpu()), shared=[False, True], device="cpu",
                    max_copies=3)
    seen = []
    main = vm["main"]

    def call(*args):
        seen.append(id(args[0]))
        return main(*args)

    t = time_callable(call, sets, device=tvm.cpu(), warmup=2, number=4, repeat=5)
    assert math.isfinite(t.median_ms) and t.median_ms > 0
    assert len(t.times_ms) == 5 and all(x > 0 for x in t.times_ms)
    assert (t.number, t.repeat, t.sets, t.method) == (4, 5, 3, "host clock")
    assert len(seen) == 2 + 4 * 5  # warm-up, then number x repeat calls (number was given)
    timed = seen[2:]
    assert timed == [id(sets[(i % 3)][0]) for i in range(20)]  # the sets in turn, across measurements
    np.testing.assert_allclose(main(*sets[2]).numpy(), arrays[0] @ arrays[1], rtol=1e-5, atol=1e-5)

    auto = time_callable(main, sets, device="cpu", warmup=1, repeat=3, min_measure_ms=2.0, flush_l2=False)
    assert auto.number >= 1 and math.isfinite(auto.median_ms) and auto.median_ms > 0
    assert auto.median_ms * auto.number >= 0.5  # about min_measure_ms per measurement (timer noise aside)


def test_time_interleaved_takes_turns():
    """Stock and vtc are measured in turn: each measurement of one follows one of the other, so a
    drift of the device's speed cannot favour the one timed first."""
    vm = _vm()
    arrays = _arrays()
    sets = rotation(arrays, lambda a: tvm.runtime.tensor(a, tvm.cpu()), shared=[False, True], device="cpu",
                    max_copies=2)
    order = []

    def make(name):
        def call(*args):
            order.append(name)
            return vm["main"](*args)
        return call

    t = time_interleaved({"stock": (make("stock"), sets), "vtc": (make("vtc"), sets[:1])}, device="cpu",
                         warmup=1, number=3, repeat=4, flush_l2=False)
    assert set(t) == {"stock", "vtc"}
    assert all(len(x.times_ms) == 4 and x.median_ms > 0 and x.number == 3 for x in t.values())
    assert (t["stock"].sets, t["vtc"].sets) == (2, 1)
    timed = order[2:]  # after one warm-up call each
    assert timed == (["stock"] * 3 + ["vtc"] * 3) * 4


def test_time_callable_torch_cpu():
    torch = pytest.importorskip("torch", reason="torch is not installed (optional: only the peers use it)")
    lin = torch.nn.Linear(32, 8).eval()
    sets = [[torch.randn(16, 32)] for _ in range(3)]
    with torch.no_grad():
        t = time_callable(lin, sets, device="cpu", warmup=2, number=5, repeat=5)
    assert math.isfinite(t.median_ms) and t.median_ms > 0 and t.sets == 3
