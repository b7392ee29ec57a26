"""libdevice functions for ``TRITON_INTERPRET=1``.

Triton's interpreter cannot run ``libdevice`` (extern) calls. Generated kernels name their math
library ``kmath``: on a GPU it is ``triton.language.extra.libdevice``; under the interpreter it is
this module, whose functions apply the same math with torch to the interpreter's NumPy-backed
tensors. Only the CPU test path uses it.
"""

from __future__ import annotations

import numpy as np
import torch
import triton.language as tl
from triton.runtime.interpreter import TensorHandle


def _wrap(fn):
    def op(*xs):
        datas = [x.handle.data for x in xs]
        out = fn(*[torch.from_numpy(np.ascontiguousarray(d)) for d in datas]).numpy()
        x = xs[0]
        if out.dtype == np.bool_:
            return tl.tensor(TensorHandle(out, tl.int1), x.type.with_element_ty(tl.int1)
                             if hasattr(x.type, "with_element_ty") else tl.int1)
        return tl.tensor(TensorHandle(out.astype(datas[0].dtype), x.dtype.scalar), x.type)

    return op


tan = _wrap(torch.tan)
asin = _wrap(torch.asin)
acos = _wrap(torch.acos)
atan = _wrap(torch.atan)
sinh = _wrap(torch.sinh)
cosh = _wrap(torch.cosh)
tanh = _wrap(torch.tanh)
asinh = _wrap(torch.asinh)
acosh = _wrap(torch.acosh)
atanh = _wrap(torch.atanh)
erf = _wrap(torch.erf)
erfc = _wrap(torch.erfc)
erfinv = _wrap(torch.erfinv)
lgamma = _wrap(torch.lgamma)
expm1 = _wrap(torch.expm1)
log1p = _wrap(torch.log1p)
log10 = _wrap(torch.log10)
log2 = _wrap(torch.log2)
exp2 = _wrap(torch.exp2)
rint = _wrap(torch.round)
trunc = _wrap(torch.trunc)
atan2 = _wrap(torch.atan2)
hypot = _wrap(torch.hypot)
copysign = _wrap(torch.copysign)
pow = _wrap(torch.pow)  # noqa: A001 - libdevice's name
fmod = _wrap(torch.fmod)
signbit = _wrap(lambda x: torch.signbit(x).to(torch.int32))
