"""Per-call overhead of a cache hit: trivial function, trivial guard."""
import sys, time, types
import kiln_frontend
from kiln_frontend import eval_frame

def add(a, b):
    return a

def check(a, b):
    return True

def convert(frame, **kw):
    co = frame.code
    if co.co_name != "add":
        return None
    return check, types.FunctionType(co.replace(), frame.globals, "add")

eval_frame.convert_frame_fn = convert
N = 1_000_000
x, y = 1, 2

def best(loop):
    return min(_t(loop) for _ in range(9)) / N * 1e9

def _t(loop):
    t0 = time.perf_counter(); loop(); return time.perf_counter() - t0

def plain_loop():
    for _ in range(N): add(x, y)

f = kiln_frontend.optimize("eager")(add)
def deco_loop():
    for _ in range(N): f(x, y)

def empty_loop():
    for _ in range(N): pass

e = best(empty_loop)
p = best(plain_loop) - e
f(x, y)
d = best(deco_loop) - e
with kiln_frontend.optimize("eager"):
    add(x, y)
    c = best(plain_loop) - e
with kiln_frontend.run():
    r = best(plain_loop) - e
print(f"Python {sys.version.split()[0]}")
print(f"plain call            {p:6.0f} ns")
print(f"inside optimize()     {c:6.0f} ns  (hook + guard + cached fn: +{c - p:.0f} ns)")
print(f"inside run()          {r:6.0f} ns  (+{r - p:.0f} ns)")
print(f"decorated f(x, y)     {d:6.0f} ns  (+{d - p:.0f} ns)")
print(dict(eval_frame.counters))
