"""The base of every patch: monkeypatches and hook handles, undone by `uninstall`."""

from __future__ import annotations

from typing import Any

_INHERITED = object()


class Patch:
    """Monkeypatches and hook handles, undone in reverse by `uninstall`."""

    def __init__(self) -> None:
        self._originals: list[tuple[Any, str, Any]] = []
        self._handles: list[Any] = []

    def install(self, probe) -> None:
        raise NotImplementedError

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._originals):
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._originals.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def replace(self, owner: Any, name: str, replacement: Any) -> None:
        # _INHERITED: the attribute came from a base class (torch._C.TensorBase): delete ours.
        self._originals.append((owner, name, owner.__dict__.get(name, _INHERITED)))
        setattr(owner, name, replacement)

    def hook(self, handle: Any) -> None:
        self._handles.append(handle)
