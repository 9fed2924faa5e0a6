"""Where a model's attention heads are, and how wide: read at run time from three places.

- `nn.MultiheadAttention` modules (embed_dim / num_heads),
- calls of `F.scaled_dot_product_attention` (q is [batch, heads, seq, head_dim]; the module
  running the call is the attention module),
- the usual config attributes on a module or its `.config` (n_head / num_heads /
  num_attention_heads with head_dim, or n_embd / hidden_size / embed_dim / d_model).

The model is scanned once per outermost module, at its first forward; calls are counted per
site, their shapes kept from the first call.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

HEAD_KEYS = ("n_head", "num_heads", "num_attention_heads", "n_heads", "nhead")
HEAD_DIM_KEYS = ("head_dim", "head_size", "d_head", "attention_head_size")
EMBED_KEYS = ("n_embd", "hidden_size", "embed_dim", "d_model", "dim")
SDPA = "scaled_dot_product_attention"
MHA = "nn.MultiheadAttention"
CONFIG = "config attributes"


@dataclass
class AttentionSite:
    source: str  # SDPA, MHA or CONFIG
    module: str  # module path, e.g. GPT.transformer.h.0.attn
    cls: str
    class_at: tuple[str, int] | None  # the class's source line
    heads: int | None
    head_dim: int
    seq_len: int | None = None
    batch: int | None = None
    dtype: str | None = None
    element_size: int | None = None
    call_at: tuple[str, int] | None = None  # the user line that called SDPA
    calls: int = 0
    modules: list[str] = field(default_factory=list)  # every module path with this site's class

    def to_dict(self) -> dict:
        return {
            "source": self.source, "module": self.module, "class": self.cls,
            "class_at": _where(self.class_at), "heads": self.heads, "head_dim": self.head_dim,
            "seq_len": self.seq_len, "batch": self.batch, "dtype": self.dtype,
            "call_at": _where(self.call_at), "calls": self.calls, "modules": self.modules[:16],
            "module_count": len(self.modules),
        }


def _where(at: tuple[str, int] | None) -> dict | None:
    return {"path": at[0], "line": at[1]} if at else None


def class_source(cls: type) -> tuple[str, int] | None:
    try:
        return inspect.getsourcefile(cls) or "", inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _lookup(holder: Any, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = holder.get(key) if isinstance(holder, dict) else getattr(holder, key, None)
        if _int(value):
            return value
    return None


def config_heads(module: Any) -> tuple[int, int] | None:
    """(heads, head_dim) from a module's attributes or its `.config`, if they say."""
    for holder in (module, getattr(module, "config", None)):
        if holder is None:
            continue
        heads = _lookup(holder, HEAD_KEYS)
        if heads is None:
            continue
        head_dim = _lookup(holder, HEAD_DIM_KEYS)
        embed = _lookup(holder, EMBED_KEYS)
        if head_dim is None and embed is not None and embed % heads == 0:
            head_dim = embed // heads
        if head_dim is not None:
            return heads, head_dim
    return None


class AttentionSites:
    def __init__(self) -> None:
        self.sites: dict[tuple[str, str], AttentionSite] = {}  # (source, class) -> first site
        self._names: dict[int, str] = {}  # id(module) -> path
        self._scanned: set[int] = set()
        self.by_module: dict[int, AttentionSite] = {}  # id(nn.MultiheadAttention) -> its site

    def scan(self, root: Any) -> None:
        if id(root) in self._scanned:
            return
        self._scanned.add(id(root))
        from torch import nn

        prefix = type(root).__name__
        for name, module in root.named_modules():
            path = f"{prefix}.{name}" if name else prefix
            self._names.setdefault(id(module), path)
            if isinstance(module, nn.MultiheadAttention):
                site = self._add(MHA, module, path, module.num_heads, module.head_dim)
                self.by_module[id(module)] = site
                continue
            found = config_heads(module)
            if found:
                self._add(CONFIG, module, path, *found)

    def _add(self, source: str, module: Any, path: str, heads: int | None,
             head_dim: int) -> AttentionSite:
        key = (source, type(module).__qualname__)
        site = self.sites.get(key)
        if site is None:
            site = AttentionSite(source, path, type(module).__name__, class_source(type(module)),
                                 heads, head_dim)
            self.sites[key] = site
        if path not in site.modules:
            site.modules.append(path)
        return site

    def forward_called(self, module: Any, where: tuple[str, int] | None) -> None:
        """A forward of any module began: an nn.MultiheadAttention's keeps its caller's line."""
        site = self.by_module.get(id(module))
        if site is not None:
            if site.call_at is None:
                site.call_at = where
            site.calls += 1

    def called(self, query: Any, module: Any, where: tuple[str, int] | None) -> None:
        """A scaled_dot_product_attention call, run inside `module` (None: outside any)."""
        shape = tuple(getattr(query, "shape", ()))
        if len(shape) < 2:
            return
        if module is None:
            owner, path = _Nowhere(), "(no module)"
        else:
            owner, path = module, self._names.get(id(module), type(module).__name__)
        heads = int(shape[-3]) if len(shape) >= 3 else None
        site = self._add(SDPA, owner, path, heads, int(shape[-1]))
        if site.calls == 0:
            site.seq_len = int(shape[-2])
            site.batch = int(shape[0]) if len(shape) >= 4 else None
            site.dtype = str(query.dtype).replace("torch.", "")
            site.element_size = query.element_size()
            site.call_at = where
            if module is None:
                site.class_at = None
        site.calls += 1

    def best(self) -> list[AttentionSite]:
        """One site per head dim, the most specific first: an SDPA call (it has the sequence
        length and dtype), then an nn.MultiheadAttention, then config attributes."""
        rank = {SDPA: 0, MHA: 1, CONFIG: 2}
        chosen: dict[int, AttentionSite] = {}
        for site in sorted(self.sites.values(), key=lambda s: rank[s.source]):
            chosen.setdefault(site.head_dim, site)
        return sorted(chosen.values(), key=lambda s: s.head_dim)


class _Nowhere:
    """Stands for 'no module' when SDPA is called outside any forward."""
