"""Devices: CUDA device objects and strings, `.cuda()`, `.is_cuda`, device-type checks.

Two worlds, kept apart so the migrated script keeps its types:
- a device *object* (`torch.device("cuda")`, `"cuda" if torch.cuda.is_available() else "cpu"`,
  `device="cuda"` arguments, `.to("cuda")`) becomes the XLA device, `torch_xla.device()`
  (or the script's own device variable when one is in scope);
- a device *string* the script keeps as a string (`device = 'cuda'` config values, argparse
  defaults, `device_type == 'cuda'`, `'cuda' in device`) becomes `'xla'`, which torch accepts
  everywhere a device string goes once torch_xla is imported.
"""
