"""FlexAttention as an operator: ``torch.nn.attention.flex_attention.flex_attention(q, k, v,
score_mod=..., block_mask=...)`` captured as torch's own node, as TorchDynamo emits it:

    flex_attention(q, k, v, score_graph, (*block_mask fields, mask_graph), scale,
                   kernel_options, (*score lifted), (*mask lifted))

- ``score_mod(score, b, h, q_idx, kv_idx)`` and the BlockMask's ``mask_mod(b, h, q_idx,
  kv_idx)`` are traced as subgraphs on 0-d arguments (score in the query's dtype, the indices
  int32); the tensors they close over (bias tables, document ids) are lifted: graph inputs of
  the frame, guarded as any tensor it reads, passed to the node as its other buffers;
- the BlockMask's tensors are read through their attributes (graph inputs, guarded), its
  sequence lengths and block sizes are constants (guarded); no BlockMask (``None``) is torch's
  empty one, made here;
- the call's Python checks (4-D inputs, heads, the mask's lengths, one device) are decided on
  the static sizes; a call eager would reject, symbolic sizes, ``return_aux`` or a non-constant
  scale or kernel option are a graph break (the call then runs in Python, where torch's eager
  flex path compiles it with torch.compile, kiln standing aside).

``create_block_mask`` inside a compiled function is not traced (it runs vmap over the mask and
builds a Python object): it is a graph break, and the BlockMask it made reaches the resumed
frame as an argument, like one made outside.
"""

from __future__ import annotations

import contextlib
import math
import operator

import torch
import torch.fx
from torch._higher_order_ops.flex_attention import flex_attention as flex_attention_hop
from torch._higher_order_ops.flex_attention import flex_attention_fake_impl
from torch.nn.attention import flex_attention as flex_module

from ...exc import Unsupported
from ..variables.base import VariableTracker
from ..variables.constant import ConstantVariable
from ..variables.containers import ListVariable, TupleVariable
from ..variables.tensor import TensorVariable
from . import HigherOrderOp, register
from .subgraph import finish, fresh_input, install, node_inputs, trace_body

_ARGS = ("query", "key", "value", "score_mod", "block_mask", "scale", "enable_gqa",
         "return_lse", "kernel_options", "return_aux")
_DEFAULTS = {"score_mod": None, "block_mask": None, "scale": None, "enable_gqa": False,
             "return_lse": False, "kernel_options": None, "return_aux": None}

# the BlockMask's fields in ``as_tuple()`` order, between its lengths and its block sizes
# (torch 2.13's; releases before it stop after full_q_indices)
_MASK_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices",
                "dq_write_order", "dq_write_order_full", "dq_kv_order", "dq_kv_order_spt")


def _identity(score, b, h, q_idx, kv_idx):
    return score


def _noop_mask(b, h, q_idx, kv_idx):
    return b.new_ones((), dtype=torch.bool)


def _constant(v: VariableTracker, what: str):
    try:
        return v.as_python_constant()
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"flex_attention with a {what} that is not a constant "
                          f"({v.describe()})") from e


def _int(x, what: str) -> int:
    if not isinstance(x, int):
        raise Unsupported(f"flex_attention with a symbolic {what} ({x})")
    return x


def _bind(args: list, kwargs: dict) -> dict:
    out = dict(zip(_ARGS, args, strict=False))
    if len(args) > len(_ARGS):
        raise Unsupported("flex_attention with too many arguments")
    for name, v in kwargs.items():
        if name not in _ARGS or name in out:
            raise Unsupported(f"flex_attention with argument {name!r}")
        out[name] = v
    for name in _ARGS[:3]:
        if name not in out:
            raise Unsupported(f"flex_attention without {name}")
    return out


def index_with_tensors(tx, obj: TensorVariable, index: VariableTracker):
    """``obj[i]`` / ``obj[i, j]`` with integer tensors as ``aten.index`` (the index tensors'
    broadcast shape), as TorchDynamo reads a mod's ``table[q_idx]``: eager's
    ``Tensor.__getitem__`` would read a 0-d index as a Python int (a host read); the dense
    rule later runs the same node on index grids. None: another kind of index."""
    items = list(index.items) if isinstance(index, TupleVariable) else [index]
    items = [tx.realize(i) for i in items]
    if not items or not all(isinstance(i, TensorVariable) and not i.example_value.is_floating_point()
                            and i.example_value.dtype is not torch.bool for i in items):
        return None
    return tx.output.create_graph_op("call_function", torch.ops.aten.index.Tensor,
                                     [obj, ListVariable(items)], {})


@contextlib.contextmanager
def _mod_indexing(tx):
    out = tx.output
    before = getattr(out, "getitem_as_index", False)
    out.getitem_as_index = True
    try:
        yield
    finally:
        out.getitem_as_index = before


def _trace_mod(tx, fn: VariableTracker | None, default, examples: list[torch.Tensor],
               requires_grad: list[bool], what: str):
    """(subgraph GraphModule, lifted outer nodes) of a score_mod or mask_mod; ``None``: the
    default one (identity, no mask), which closes over nothing."""
    if fn is None:
        return torch.fx.symbolic_trace(default), []
    inputs = [fresh_input(tx, e, i, requires_grad=rg)
              for i, (e, rg) in enumerate(zip(examples, requires_grad, strict=True))]
    with _mod_indexing(tx):
        body = trace_body(tx, fn, inputs, what, single=True)
    (sub,), lifted = finish(tx, [body], "FlexAttentionMod")
    return sub.gm, lifted


#: what the capture calls of torch's flex module (private helpers that differ by release)
_FLEX_HELPERS = ("_create_empty_block_mask", "_apply_kernel_options", "_LARGE_SPARSE_BLOCK_SIZE",
                 "noop_mask")


def capture_flex_attention(tx, args, kwargs) -> VariableTracker:
    absent = [h for h in _FLEX_HELPERS if not hasattr(flex_module, h)]
    if absent:
        raise Unsupported(f"flex_attention: torch {torch.__version__}'s flex module has no "
                          f"{', '.join(absent)}, which kiln's capture calls")
    a = _bind(list(args), dict(kwargs))
    q, k, v = (tx.realize(a[n]) for n in ("query", "key", "value"))
    if not all(isinstance(t, TensorVariable) for t in (q, k, v)):
        raise Unsupported("flex_attention on arguments that are not tensors")
    consts = {n: (_DEFAULTS[n] if n not in a else _constant(tx.realize(a[n]), n))
              for n in ("scale", "enable_gqa", "return_lse", "kernel_options", "return_aux")}
    if consts["return_aux"] is not None:
        raise Unsupported("flex_attention with return_aux")
    qe, ke, ve = q.example_value, k.example_value, v.example_value
    if qe.dim() != 4 or ke.dim() != 4 or ve.dim() != 4:
        raise Unsupported("flex_attention on inputs that are not 4-D (eager rejects them)")
    B, Hq, L, E = (_int(s, "size") for s in qe.shape)
    Bk, Hkv, S, _ = (_int(s, "size") for s in ke.shape)
    _int(ve.shape[-1], "size")
    if len({qe.device, ke.device, ve.device}) != 1 or qe.dtype != ke.dtype:
        raise Unsupported("flex_attention on inputs of different devices or dtypes")
    if Hq != Hkv and (not consts["enable_gqa"] or Hq % Hkv):
        raise Unsupported("flex_attention with mismatched heads (eager rejects them)")
    if B != Bk and not (Bk == 1):
        raise Unsupported("flex_attention with batch sizes that do not broadcast")
    bm = a.get("block_mask")
    bm = None if bm is None else tx.realize(bm)
    if isinstance(bm, ConstantVariable) and bm.as_python_constant() is None:
        bm = None
    if bm is None:
        if B != Bk:
            raise Unsupported("flex_attention with different batch sizes and no block_mask")
        # torch's empty BlockMask (one block covering everything), made now: its tensors are
        # new values the graph reads through globals
        bm = tx.wrap_value(flex_module._create_empty_block_mask(
            torch.empty(0, device=qe.device), None), None)
    elif getattr(bm, "value", None).__class__ is not flex_module.BlockMask:
        raise Unsupported(f"flex_attention with block_mask {bm.describe()}")
    missing = [f for f in ("seq_lengths", "BLOCK_SIZE", "mask_mod", *_MASK_FIELDS[:8])
               if not hasattr(bm.value, f)]
    if missing:
        raise Unsupported(f"flex_attention: torch {torch.__version__}'s BlockMask has no "
                          f"{', '.join(missing)}, which kiln's capture reads")
    seq = _constant(tx.getattr(bm, "seq_lengths"), "BlockMask.seq_lengths")
    block = _constant(tx.getattr(bm, "BLOCK_SIZE"), "BlockMask.BLOCK_SIZE")
    # this release's as_tuple() layout (torch 2.11's BlockMask has no dq_* orders)
    fields = [tx.realize(tx.getattr(bm, f)) for f in _MASK_FIELDS if hasattr(bm.value, f)]
    if tuple(block) != (flex_module._LARGE_SPARSE_BLOCK_SIZE,) * 2 and \
            (L, S) != tuple(seq):
        raise Unsupported(f"flex_attention with a BlockMask made for lengths {tuple(seq)} on "
                          f"q/kv lengths {(L, S)} (eager rejects it)")
    for f in fields:
        if isinstance(f, TensorVariable) and f.example_value.device != qe.device:
            raise Unsupported("flex_attention with a BlockMask on another device")
    scale = consts["scale"]
    if scale is None:
        scale = 1.0 / math.sqrt(E)
    if not isinstance(scale, (int, float)):
        raise Unsupported("flex_attention with a scale that is not a Python number")
    with tx.output.fake_mode:
        kernel_options = flex_module._apply_kernel_options(qe, ke, ve, consts["return_lse"],
                                                           consts["kernel_options"])

    # the mods, each on fresh 0-d arguments
    score_fn = a.get("score_mod")
    score_fn = None if score_fn is None else tx.realize(score_fn)
    if isinstance(score_fn, ConstantVariable) and score_fn.as_python_constant() is None:
        score_fn = None
    idx = torch.empty((), dtype=torch.int32, device=qe.device)
    score_gm, score_lifted = _trace_mod(
        tx, score_fn, _identity, [torch.empty((), dtype=qe.dtype, device=qe.device)] +
        [idx] * 4, [qe.requires_grad] + [False] * 4, "flex_attention's score_mod")
    mask_fn = tx.realize(tx.getattr(bm, "mask_mod"))
    noop = getattr(mask_fn, "fn", None) is flex_module.noop_mask
    mask_gm, mask_lifted = _trace_mod(tx, None if noop else mask_fn, _noop_mask, [idx] * 4,
                                      [False] * 4, "flex_attention's mask_mod")

    score_var = install(tx, score_gm, "flex_score_mod")
    mask_var = install(tx, mask_gm, "flex_mask_mod")
    out = tx.output

    def px(f):
        return f.as_proxy() if isinstance(f, TensorVariable) else _constant(f, "BlockMask field")

    score_bufs = node_inputs(score_lifted)
    mask_bufs = node_inputs(mask_lifted)
    block_tuple = (*seq, *(px(f) for f in fields), *block, mask_var.as_proxy())
    proxy = out.tracer.create_proxy(
        "call_function", flex_attention_hop,
        (q.as_proxy(), k.as_proxy(), v.as_proxy(), score_var.as_proxy(), block_tuple,
         float(scale), kernel_options, tuple(b.as_proxy() for b in score_bufs),
         tuple(b.as_proxy() for b in mask_bufs)), {})
    # the fake-tensor rule: torch's (sizes and the query's layout), plus whether the result
    # needs grad (any differentiable input does)
    needs_grad = torch.is_grad_enabled() and any(
        getattr(t, "requires_grad", False)
        for t in (qe, ke, ve, *(b.as_example() for b in score_bufs)))
    with out.fake_mode:
        example = flex_attention_fake_impl(qe, ke, ve, score_gm, (), float(scale),
                                           kernel_options)
        if needs_grad:
            example = tuple(e.detach().requires_grad_(True) for e in example)
    result = out.wrap_result(proxy, example)
    attn, lse = result.items[0], result.items[1]
    if not consts["return_lse"]:
        return attn
    if kernel_options.get("BACKEND") != "FLASH":  # the node's statistics are in log2 units
        lse = tx.call_function(tx.wrap_value(operator.mul, None),
                               [lse, ConstantVariable(math.log(2.0))], {})
    return TupleVariable([attn, lse])


register(HigherOrderOp(
    name="flex_attention",
    callables=(flex_module.flex_attention,),
    capture=capture_flex_attention,
    fake_rule="torch's flex_attention fake rule (output in the query's layout, float32 "
              "logsumexp and max in log2 units)",
    autograd_rule="kiln_aotgrad.flex_attention: the node is rewritten, while aotgrad traces, "
                  "into dense ATen math (scores, score_mod and mask_mod on broadcast index "
                  "grids, a stable softmax, @ v); autograd differentiates that",
    lowering="none: the ATen math it becomes is lowered as any graph's",
))
