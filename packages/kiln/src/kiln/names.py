"""Graph-relative names of a module's tensors: ``m3.weight`` instead of ``layer1.0.conv1.weight``.

A torch-level graph names the modules it calls and the attributes it reads; ``GraphNames``
numbers them by order of appearance (``m0, m1, ...`` for modules, ``a0, ...`` for attributes),
so two modules with the same structure but other attribute names give the same names. An
Artifact names the tensors its constants come from and the weights it guards this way, and
assembling it resolves those names against the live module (``resolve``).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["GraphNames", "graph_names"]


class GraphNames:
    """The renaming of a graph's modules and attributes, both ways:
    ``normalize("layer1.0.conv1.weight") == "m3.weight"`` and ``resolve`` gives the live
    object for a normalized name."""

    def __init__(self) -> None:
        self.to_norm: dict[str, str] = {}
        self.from_norm: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"GraphNames({self.from_norm})"

    def add(self, original: str, prefix: str) -> str:
        if original not in self.to_norm:
            norm = f"{prefix}{len(self.to_norm)}"
            self.to_norm[original] = norm
            self.from_norm[norm] = original
        return self.to_norm[original]

    def normalize(self, qualname: str) -> str | None:
        """The normalized name of a module tensor's qualified name (longest known prefix)."""
        atoms = qualname.split(".")
        for cut in range(len(atoms), 0, -1):
            head = ".".join(atoms[:cut])
            if head in self.to_norm:
                return ".".join([self.to_norm[head], *atoms[cut:]])
        return None

    def resolve(self, gm: torch.nn.Module, norm: str) -> Any:
        head, *rest = norm.split(".")
        obj: Any = gm
        for atom in [*self.from_norm[head].split("."), *rest]:
            obj = getattr(obj, atom)
        return obj

    def name_live_objects(self, gm: torch.nn.Module) -> dict[int, str]:
        """``id(obj) -> name`` of every tensor and module reachable from a named module or
        attribute (the first name found wins): how a compile's live guards become names."""
        found: dict[int, str] = {}
        for norm in self.from_norm:
            obj = self.resolve(gm, norm)
            found.setdefault(id(obj), norm)
            if isinstance(obj, torch.nn.Module):
                for qual, sub in obj.named_modules(remove_duplicate=False):
                    found.setdefault(id(sub), f"{norm}.{qual}" if qual else norm)
                tensors = [*obj.named_parameters(remove_duplicate=False),
                           *obj.named_buffers(remove_duplicate=False)]
                for qual, t in tensors:
                    found.setdefault(id(t), f"{norm}.{qual}")
        return found


def graph_names(gm: torch.nn.Module) -> GraphNames:
    """The names ``kiln.cache.normalized_graph`` gives ``gm``'s modules and attributes (the
    same walk, without the graph's text). The backend also takes a plain ``nn.Module``
    (aotgrad traces any module): its children and own tensors are named in their order."""
    names = GraphNames()
    if not isinstance(gm, torch.fx.GraphModule):
        for name, _ in gm.named_children():
            names.add(name, "m")
        for name, _ in [*gm.named_parameters(recurse=False), *gm.named_buffers(recurse=False)]:
            names.add(name, "a")
        return names
    for n in gm.graph.nodes:
        if n.op == "call_module":
            names.add(n.target, "m")
        elif n.op == "get_attr":
            names.add(n.target, "a")
    return names
