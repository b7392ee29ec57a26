import time, torch
from kiln_frontend._evalframe import TensorGuard
a, b = torch.randn(4), torch.randn(4)
ga, gb = TensorGuard(a), TensorGuard(b)
def tguard(x_, y_):
    return ga(x_) and gb(y_)
N=200000
def bench(name, f):
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter(); f(); best = min(best, time.perf_counter() - t0)
    print(f"{name}: {best/N*1e9:.0f} ns")
def l1():
    for _ in range(N): ga(a)
def l2():
    for _ in range(N): tguard(a, b)
def l3():
    for _ in range(N): a.dtype
def l4():
    for _ in range(N): torch._C._dispatch_keys(a)
def l5():
    for _ in range(N): a.device
def l6():
    for _ in range(N): a.stride()
def l7():
    for _ in range(N): a.shape
def l8():
    for _ in range(N): a.requires_grad
k = torch._C._dispatch_keys(a)
def l9():
    for _ in range(N): k == k
d = a.device
def l10():
    for _ in range(N): d == d
for n, f in [("guard", l1), ("tguard(2)", l2), ("dtype", l3), ("keys", l4), ("device", l5), ("stride", l6), ("shape", l7), ("rg", l8), ("keys==", l9), ("dev==", l10)]:
    bench(n, f)
