import inspect, statistics, sys, timeit, types
import kiln_frontend
from kiln_frontend import eval_frame, _evalframe as C

def add(a, b):
    return a

def make(frame, *, compiler_fn, nopython, frame_state, **kw):
    co = frame.code
    if co.co_name not in ("add", "tiny"):
        return None
    fl = co.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    fn = types.FunctionType(co.replace(co_argcount=len(frame.args), co_posonlyargcount=0, co_kwonlyargcount=0, co_flags=fl), frame.globals, co.co_name)
    return (GUARD, fn)

def trivial(a, b):
    return True
GUARD = trivial
eval_frame.convert_frame_fn = make
N = 200000
def t(stmt):
    return statistics.median(timeit.repeat(stmt, number=N, repeat=7)) / N * 1e9

x, y = 1, 2
plain = t(lambda: add(x, y))
f = kiln_frontend.optimize("eager")(add)
f(x, y)
deco = t(lambda: f(x, y))
def loop_plain():
    for _ in range(N): add(x, y)
def loop():
    for _ in range(N): add(x, y)
base = statistics.median(timeit.repeat(loop_plain, number=1, repeat=7)) / N * 1e9
with kiln_frontend.optimize("eager"):
    add(x, y)
    ctx = statistics.median(timeit.repeat(loop, number=1, repeat=7)) / N * 1e9
print(f"python {sys.version_info[:2]}")
print(f"plain call via lambda: {plain:.0f} ns; decorated: {deco:.0f} ns; overhead {deco - plain:.0f} ns")
print(f"in-context loop: plain {base:.0f} ns/call, hooked cache hit {ctx:.0f} ns/call, overhead {ctx - base:.0f} ns")
try:
    import torch
except ImportError:
    sys.exit()
kiln_frontend.reset()
a, b = torch.randn(4), torch.randn(4)
ga, gb = C.TensorGuard(a), C.TensorGuard(b)
def tguard(x_, y_):
    return ga(x_) and gb(y_)
GUARD = tguard
def tiny(x_, y_):
    return x_ + y_
g = kiln_frontend.optimize("eager")(tiny)
g(a, b)
pt = t(lambda: tiny(a, b)); gt = t(lambda: g(a, b))
print(f"tensors: eager {pt:.0f} ns, decorated w/ 2 TensorGuards {gt:.0f} ns, overhead {gt-pt:.0f} ns")
print("tguard alone", t(lambda: tguard(a, b)))
print("ga alone", t(lambda: ga(a)))
with kiln_frontend.optimize("eager"):
    tiny(a, b)
    print("in ctx tiny", t(lambda: tiny(a, b)))
print(eval_frame.counters)
