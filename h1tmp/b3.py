import time, torch, types, inspect
import kiln_frontend
from kiln_frontend import eval_frame, _evalframe as C
a, b = torch.randn(4), torch.randn(4)
ga, gb = C.TensorGuard(a), C.TensorGuard(b)
def tguard(x_, y_):
    return ga(x_) and gb(y_)
def true2(x_, y_):
    return True
def tiny(x_, y_):
    return x_ + y_
G = [tguard]
def conv(frame, **kw):
    co = frame.code
    if co.co_name != "tiny": return None
    fn = types.FunctionType(co.replace(), frame.globals, "tiny")
    return G[0], fn
eval_frame.convert_frame_fn = conv
N = 100000
def bench(name, f):
    best = 1e9
    for _ in range(7):
        t0 = time.perf_counter(); f(); best = min(best, time.perf_counter() - t0)
    print(f"{name}: {best/N*1e9:.0f} ns")
def loop():
    for _ in range(N): tiny(a, b)
def gl():
    for _ in range(N): tguard(a, b)
bench("eager", loop)
bench("tguard", gl)
with kiln_frontend.optimize("eager"):
    tiny(a, b)
    bench("hooked w/ tensor guards", loop)
kiln_frontend.reset(); G[0] = true2
with kiln_frontend.optimize("eager"):
    tiny(a, b)
    bench("hooked w/ trivial guard", loop)
with kiln_frontend.run():
    bench("run-only w/ trivial guard", loop)
kiln_frontend.reset(); G[0] = tguard
prev = C.set_eval_frame(None)
import threading
# hook installed interp-wide (another thread holds a callback) but off here
ev = threading.Event(); done = threading.Event()
def holder():
    C.set_eval_frame(False); ev.set(); done.wait(); C.set_eval_frame(None)
th = threading.Thread(target=holder); th.start(); ev.wait()
print("installed:", C.hook_installed())
bench("tguard with hook installed but off", gl)
bench("eager with hook installed but off", loop)
done.set(); th.join()
print("installed:", C.hook_installed())
bench("tguard again", gl)
