"""kiln_runtime.cudagraphs: the bookkeeping on CPU (an engine whose "replay" reruns the
function into the recorded output buffers, overwriting them as a CUDA graph replay does), and
the real thing on CUDA (marked ``cuda``)."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch
from kiln_runtime import cudagraphs
from kiln_runtime.cudagraphs import CudaGraphConfig, CudaGraphRunner


class ReplayEngine:
    """Records by running ``fn`` once; replays by running it again on the recorded (static)
    inputs and writing the results into the recorded outputs in place."""

    def __init__(self, device_type: str = "cpu", fail: bool = False):
        self.device_type = device_type
        self.pool = object()
        self.fail = fail
        self.captures = 0
        self.replays = 0

    def capture(self, fn, inputs):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captures += 1
        # like a CUDA capture, recording has no effect on the inputs: run on copies to get
        # output buffers; the first replay computes them
        outputs = fn([x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
        return (fn, list(inputs), outputs), outputs, 0

    def replay(self, handle):
        fn, inputs, outputs = handle
        for out, new in zip(outputs, fn(list(inputs)), strict=True):
            out.copy_(new)
        self.replays += 1


@pytest.fixture(autouse=True)
def _fresh_records():
    cudagraphs.reset()
    yield
    cudagraphs.reset()


def affine(args):
    (x,) = args
    return [x * 2 + 1, x.sum()]


def _runner(fn=affine, engine=None, **kwargs):
    engine = engine or ReplayEngine()
    return CudaGraphRunner(fn, name="test", engine=engine, **kwargs), engine


def test_outputs_of_three_replays_held_at_once_stay_correct():
    runner, engine = _runner()
    runner(torch.randn(4))  # warm-up: runs fn as is
    xs = [torch.randn(4) for _ in range(3)]
    held = [runner(x) for x in xs]
    for x, (y, s) in zip(xs, held, strict=True):
        torch.testing.assert_close(y, x * 2 + 1)
        torch.testing.assert_close(s, x.sum())
    # two slots handed out views; the third call replayed the copy slot and copied out
    assert engine.captures == 3 and engine.replays == 3
    assert [r.slot for r in cudagraphs.recordings()] == ["alias 0", "alias 1", "copy"]


def test_a_dropped_output_frees_its_slot():
    runner, engine = _runner()
    runner(torch.randn(4))
    for _ in range(5):
        x = torch.randn(4)
        y, s = runner(x)
        torch.testing.assert_close(y, x * 2 + 1)
        del y, s
    assert engine.captures == 1 and engine.replays == 5


def test_a_held_view_keeps_its_output_alive():
    runner, engine = _runner()
    runner(torch.randn(4))
    x1 = torch.randn(4)
    first = runner(x1)[0][1:3]  # only a view survives
    runner(torch.randn(4))
    torch.testing.assert_close(first, (x1 * 2 + 1)[1:3])
    assert engine.captures == 2


def _two_runners_a_slot_dropped():
    """Runners a (x * 2 + 1) and b (x - 1) recorded in one engine's shared pool, in that
    order; a then ran once more with its outputs dropped (its slot 0 free again)."""
    engine = ReplayEngine()
    a, _ = _runner(engine=engine)
    b, _ = _runner(lambda args: [args[0] - 1], engine=engine)
    for r in (a, b):
        r(torch.randn(4))
    del a(torch.randn(4))[0]
    return engine, a, b


def test_later_recording_in_the_shared_pool_blocks_an_earlier_slot():
    engine, a, b = _two_runners_a_slot_dropped()  # a's slot 0, outputs dropped
    held_b = b(torch.randn(4))  # b recorded after a: its outputs may sit in a's temporaries
    captures = engine.captures
    x = torch.randn(4)
    y, _ = a(x)  # a's slot 0 must not be replayed while b's outputs are held
    assert engine.captures == captures + 1
    torch.testing.assert_close(y, x * 2 + 1)
    del held_b


def test_mutated_inputs_are_copied_back():
    def bump(args):
        (x,) = args
        x.add_(1)
        return [x * 3]

    runner, _ = _runner(bump, mutated_inputs=(0,))
    runner(torch.zeros(3))
    x = torch.zeros(3)
    (y,) = runner(x)
    torch.testing.assert_close(x, torch.ones(3))
    torch.testing.assert_close(y, torch.full((3,), 3.0))
    runner(x)
    torch.testing.assert_close(x, torch.full((3,), 2.0))


def test_a_mutated_input_aliasing_another_runs_without_a_graph(caplog):
    def add_into(args):
        x, y = args
        x.add_(y)
        return [x.clone()]

    runner, engine = _runner(add_into, mutated_inputs=(0,))
    runner(torch.zeros(4), torch.ones(4))
    base = torch.ones(8)
    with caplog.at_level(logging.INFO, logger="kiln.cudagraphs"):
        (out,) = runner(base[:4], base[4:])
    torch.testing.assert_close(out, torch.full((4,), 2.0))
    assert engine.captures == 0
    assert "shares memory" in caplog.text


def test_buckets_pad_dim0_and_slice_outputs():
    def rows(args):
        (x,) = args
        return [x.sum(1), x * 2]

    settings = CudaGraphConfig(buckets=(2, 4, 8))
    runner, engine = _runner(rows, bucketed=True, settings=settings)
    runner(torch.randn(3, 5))
    for batch in (3, 1, 4, 3, 2, 11):
        x = torch.randn(batch, 5)
        s, d = runner(x)
        torch.testing.assert_close(s, x.sum(1))
        torch.testing.assert_close(d, x * 2)
        del s, d
    # buckets 4, 2 and the exact size 11 (past the last bucket)
    assert engine.captures == 3
    assert sorted(e.signature for e in runner.entries.values()) == sorted(
        ["torch.float32[4, 5]c", "torch.float32[2, 5]c", "torch.float32[11, 5](5, 1)"])


def test_re_recording_is_limited_and_logged(caplog):
    runner, engine = _runner(settings=CudaGraphConfig(buckets=None, max_recordings=2))
    runner(torch.randn(1))
    with caplog.at_level(logging.INFO, logger="kiln.cudagraphs"):
        for n in (2, 3, 4, 5):
            x = torch.randn(n)
            torch.testing.assert_close(runner(x)[0], x * 2 + 1)
    assert engine.captures == 2
    assert "input signatures" in caplog.text
    assert cudagraphs.skips["re-recording limit"] == 1


def test_cpu_tensors_skip_with_a_logged_reason(caplog):
    runner, engine = _runner(engine=ReplayEngine(device_type="cuda"))
    with caplog.at_level(logging.INFO, logger="kiln.cudagraphs"):
        for _ in range(3):
            x = torch.randn(4)
            torch.testing.assert_close(runner(x)[0], x * 2 + 1)
    assert engine.captures == 0
    assert runner.skip_reason.startswith("CPU tensors")
    assert "CUDA graphs skipped" in caplog.text and cudagraphs.skips["CPU tensors"] == 1


def test_a_failed_capture_skips_with_its_reason():
    runner, engine = _runner(engine=ReplayEngine(fail=True))
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(runner(x)[0], x * 2 + 1)
    assert runner.skip_reason.startswith("capture failed")
    assert "stream is capturing" in runner.skip_reason


def test_skip_reason_given_up_front():
    runner, engine = _runner(skip_reason="data-dependent shapes: nonzero")
    for _ in range(2):
        x = torch.randn(4)
        torch.testing.assert_close(runner(x)[0], x * 2 + 1)
    assert engine.captures == 0 and cudagraphs.skips["data-dependent shapes"] == 1


def test_recordings_report_memory():
    runner, _ = _runner()
    runner(torch.randn(16))
    runner(torch.randn(16))
    (rec,) = cudagraphs.recordings()
    assert rec.output_bytes == 16 * 4 + 4 and rec.input_bytes == 16 * 4
    assert rec.total_bytes == rec.output_bytes + rec.input_bytes + rec.pool_bytes


def test_holding_the_last_output_in_a_loop_stays_correct():
    # ``out = runner(x)`` in a loop: at each call the previous output is still held
    runner, engine = _runner()
    runner(torch.randn(4))
    previous = None
    for _ in range(9):
        x = torch.randn(4)
        out = runner(x)
        torch.testing.assert_close(out[0], x * 2 + 1)
        if previous is not None:  # the call did not overwrite what the user held
            torch.testing.assert_close(previous[1][0], previous[0] * 2 + 1)
        previous = (x, out)
    assert engine.captures == 3  # two alias slots and the copy slot, recorded once each


def test_entries_are_keyed_by_strides_dtypes_and_plain_inputs():
    def scale(args):
        x, k = args
        return [x * k]

    runner, engine = _runner(scale)
    runner(torch.randn(2, 3), 2)
    x = torch.randn(3, 2)
    calls = [(torch.randn(2, 3), 2), (x.t(), 2), (torch.randn(2, 3, dtype=torch.float64), 2),
             (torch.randn(2, 3), 2.5), (torch.randn(2, 3), 2)]
    for a, k in calls:
        torch.testing.assert_close(runner(a, k)[0], a * k)
    assert len(runner.entries) == 4 and engine.captures == 4
    assert sorted(e.signature for e in runner.entries.values())[0].startswith("torch.float32[2, 3]")


def test_static_inputs_are_used_in_place_and_keyed_by_address():
    def times_weight(args):
        x, w = args
        return [x * w]

    w = torch.ones(4)
    runner, engine = _runner(times_weight, static_inputs=(1,))
    runner(torch.randn(4), w)
    x = torch.randn(4)
    torch.testing.assert_close(runner(x, w)[0], x)
    w.fill_(3.0)  # read in place by the graph: no copy, the replay sees the new value
    torch.testing.assert_close(runner(x, w)[0], x * 3)
    other = torch.full((4,), 5.0)  # another address: another entry
    torch.testing.assert_close(runner(x, other)[0], x * 5)
    assert len(runner.entries) == 2 and engine.captures == 2


def test_outputs_of_a_dropped_runner_still_block_earlier_slots():
    # a recompile drops a runner while the user holds its outputs: their memory stays in the
    # shared pool, where an earlier graph's temporaries may go
    engine, a, b = _two_runners_a_slot_dropped()
    xb = torch.randn(4)
    held_b = b(xb)  # recorded after a's slot 0, outputs held
    del b
    captures = engine.captures
    x = torch.randn(4)
    torch.testing.assert_close(a(x)[0], x * 2 + 1)
    assert engine.captures == captures + 1  # not a's slot 0: a new slot
    torch.testing.assert_close(held_b[0], xb - 1)
    del held_b
    captures = engine.captures
    torch.testing.assert_close(a(x)[0], x * 2 + 1)  # nothing held now: slot 0 again
    assert engine.captures == captures


# ------------------------------------------------------------------------------- on CUDA

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.cuda
@cuda
def test_cuda_three_held_replays_are_correct():
    w = torch.randn(64, 64, device="cuda")

    def mlp(args):
        (x,) = args
        return [torch.relu(x @ w) + 1]

    runner = CudaGraphRunner(mlp, name="cuda-mlp")
    runner(torch.randn(8, 64, device="cuda"))
    xs = [torch.randn(8, 64, device="cuda") for _ in range(3)]
    held = [runner(x)[0] for x in xs]
    for x, y in zip(xs, held, strict=True):
        torch.testing.assert_close(y, torch.relu(x @ w) + 1)
    assert len(cudagraphs.recordings()) == 3
    assert all(r.total_bytes > 0 for r in cudagraphs.recordings())
    for _ in range(10):  # dropped outputs: slot reuse, still right
        x = torch.randn(8, 64, device="cuda")
        torch.testing.assert_close(runner(x)[0], torch.relu(x @ w) + 1)
    assert len(cudagraphs.recordings()) == 3


_FAILED_CAPTURE_SCRIPT = """
import logging, torch
from kiln_runtime.cudagraphs import CudaGraphRunner
logging.basicConfig(level=logging.INFO)

def syncing(args):
    (x,) = args
    y = torch.rand_like(x) * 0 + x  # registers the generator with the capture
    if float(y.sum()) > 1e30:  # a host sync: illegal while capturing
        y = y + 1
    return [y * 2]

runner = CudaGraphRunner(syncing, name="cuda-sync")
x = torch.randn(8, device="cuda")
runner(x)  # warm-up
torch.testing.assert_close(runner(x)[0], x * 2)  # the capture fails: runs without a graph
assert runner.skip_reason is not None and runner.skip_reason.startswith("capture failed")
torch.testing.assert_close(runner(x)[0], x * 2)
assert torch.randn(4, device="cuda").isfinite().all()
print("OK")
"""


@pytest.mark.cuda
@cuda
def test_cuda_failed_capture_falls_back_and_leaves_random_ops_working():
    """A capture that fails part-way (a host sync inside it) runs the graph eagerly, and a
    random op afterwards still works: the generator is not left registered as capturing.
    In a process of its own: a failed capture can leave CUDA state that later captures in
    the same process trip over."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FAILED_CAPTURE_SCRIPT], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout + done.stderr
    assert "generator was released" in done.stderr


def test_a_pool_whose_graphs_are_all_freed_is_not_recorded_into_again(monkeypatch):
    # torch retires a private pool when its last graph is freed; recording into the old
    # handle again trips an allocator assert, so the engine forgets it
    from kiln_runtime.cudagraphs import CudaGraphEngine

    monkeypatch.setattr(CudaGraphEngine, "_pools", {0: "pool-a"})
    monkeypatch.setattr(CudaGraphEngine, "_live", Counter({"pool-a": 2}))
    CudaGraphEngine._graph_freed(0, "pool-a")
    assert CudaGraphEngine._pools == {0: "pool-a"}
    CudaGraphEngine._graph_freed(0, "pool-a")
    assert CudaGraphEngine._pools == {} and not CudaGraphEngine._live


@pytest.mark.cuda
@cuda
def test_cuda_records_again_after_every_graph_of_the_pool_was_freed():
    import gc

    w = torch.randn(16, 16, device="cuda")

    def fn(args):
        return [args[0] @ w + 1]

    for _ in range(2):  # the second runner records after the first one's graphs are gone
        runner = CudaGraphRunner(fn, name="cuda-pool")
        x = torch.randn(4, 16, device="cuda")
        for _ in range(3):
            torch.testing.assert_close(runner(x)[0], x @ w + 1)
        assert runner.skip_reason is None and runner.entries
        del runner
        gc.collect()
