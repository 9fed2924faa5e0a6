"""TPU123 logging-config: `logging.basicConfig(...)` takes effect after `import torch_xla`.

Its messages and tables: rules/TPU123-logging-config.toml.
"""

from __future__ import annotations

import libcst as cst

from tpukit.migrate.transforms.base import Transform, transform


@transform("TPU123")
class LoggingConfig(Transform):
    """`import torch_xla` calls `logging.basicConfig()` (torch_xla/__init__.py), which gives the
    root logger a handler: the script's own `logging.basicConfig(level=..., stream=...)` is then
    a no-op (it configures only a root logger without handlers), and its INFO lines vanish.
    `force=True` replaces that handler with the script's configuration, as on CUDA."""

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.ctx.qualify(original.func) != "logging.basicConfig":
            return None
        if any(a.star or (a.keyword is not None and a.keyword.value == "force")
               for a in original.args):
            return None  # forced already, or a splat that may say

        def build():
            force = cst.Arg(keyword=cst.Name("force"), value=cst.Name("True"),
                            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                  whitespace_after=cst.SimpleWhitespace("")))
            args = list(updated.args)
            if args and isinstance(args[-1].comma, cst.Comma):
                # one argument a line, a trailing comma: the new one last, laid out the same
                between = args[-2].comma if len(args) > 1 else args[-1].comma
                force = force.with_changes(comma=args[-1].comma)
                args[-1] = args[-1].with_changes(comma=between)
            elif args:
                args[-1] = args[-1].with_changes(
                    comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            return updated.with_changes(args=[*args, force])

        return self.fix_or_report(original, self.say("config", code=self.ctx.short(original)),
                                  build)
