"""Writes a weight's version counter does not see: aliases taken with ``Tensor.data``.

``p.data`` is a new tensor over ``p``'s memory with a version counter of its own, so
``p.data.mul_(3)`` (an EMA update, a hand-written optimizer, re-initialisation) changes ``p``
without moving ``p._version``. A constant kiln computed from ``p`` (a BatchNorm folded into a
conv, a weight packed for MKL's GEMM) would keep the old values. ``WeightsGuard`` sees such
writes through this module. Once it is imported, ``Tensor.data`` reads through a property
(the C descriptor still does the work, ``__torch_function__`` handling included) that

- remembers each alias it hands out, weakly, by the memory it starts at, so
  ``watch(tensors)``, when a guard is made over the weights its constants were computed
  from, returns a reader of each live alias of them (``w = p.data`` kept from before):
  kiln's own alias of it, sharing its version counter, readable after the alias itself is
  gone. The guard sums their counters with the weights' own, so a write through a kept
  alias compiles again;
- counts each take from watched memory, whatever tensor it is taken from (``p.data``,
  ``p[0].data``, ``p.detach().data``: ``takes``): a guard whose weights were taken from
  since it was made compiles again (a take that only reads costs one compile).

Not seen: writes through memory no ``.data`` alias owns (a ``.numpy()`` array, a
``torch.from_numpy`` of it, ``ctypes``, ``set_`` on the storage), and aliases taken before
this module was imported (``import kiln`` first); docs/kiln.md names them.
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["STATE", "takes", "watch"]

#: the C-level ``Tensor.data`` the property reads and writes through
_DATA = torch._C.TensorBase.__dict__["data"]


class _State:
    """``epoch`` grows at each take from watched memory: a guard compares one int per call
    and counts its own weights' takes only when it moved."""

    epoch = 0


STATE = _State()
#: a tensor type's ``__torch_dispatch__`` unless it is a dispatch subclass (fake, wrapper)
_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__
#: ``.data`` takes from watched memory, by the address its storage starts at
_takes: dict[int, int] = {}
#: the live ``.data`` aliases, by the address their storage starts at: {id: weak reference}
_aliases: dict[int, dict[int, weakref.ref]] = {}


def takes(tensors) -> int:
    """How many times ``.data`` was taken from the memory of ``tensors`` since watched."""
    return sum(_takes.get(_address(t), 0) for t in tensors)


def watch(tensors) -> list[torch.Tensor]:
    """Watch the memory of ``tensors`` (weights a guard computed constants from) for
    ``.data`` takes, and return a reader (``t.detach()``: it shares the alias's counter) of
    each live ``.data`` alias of that memory."""
    readers = []
    for address in {_address(t) for t in tensors} - {0}:
        _takes.setdefault(address, 0)
        live = (ref() for ref in list(_aliases.get(address, {}).values()))
        readers += [alias.detach() for alias in live if alias is not None]
    return readers


def _address(t: torch.Tensor) -> int:
    """Where ``t``'s storage starts (0: none of its own: meta, fake, a wrapper subclass).
    Devices share one address space (CUDA's unified addressing); a clash would only make a
    guard compile again."""
    if type(t).__torch_dispatch__ is not _PLAIN_DISPATCH:
        return 0
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return 0


def _data_get(self):
    alias = _DATA.__get__(self)
    address = _address(alias)
    if address:
        count = _takes.get(address)
        if count is not None:
            _takes[address] = count + 1
            STATE.epoch += 1
        ident = id(alias)

        def forget(ref):
            live = _aliases.get(address)
            if live is not None and live.get(ident) is ref:
                del live[ident]
                if not live:
                    del _aliases[address]

        live = _aliases.get(address)
        if live is None:
            live = _aliases[address] = {}
        live[ident] = weakref.ref(alias, forget)
    return alias


def _data_set(self, value) -> None:
    _DATA.__set__(self, value)


torch.Tensor.data = property(_data_get, _data_set, doc=_DATA.__doc__)
