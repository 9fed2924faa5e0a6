"""Facts about a file (and the program it belongs to) computed once, read by every rule: what
a value is decided by where it comes from and where it goes, never by how it is spelled."""

# The analyses a rule may read, by the name it declares them with (`Transform.uses`, as
# libcst's METADATA_DEPENDENCIES): each is computed once per file, on first use, and shared.
# tests/test_migrate_structure.py checks that a rule module reads exactly what its rule
# declares (the analysis modules it imports, `ctx.values`, `ctx.device_expr()`).
PROVIDERS = {
    "values": "what each value of the file is, by dataflow (values.py, kinds.py, uses.py: "
              "`ctx.values`)",
    "device_facts": "the device variable in scope (migrate/device_facts.py: "
                    "`ctx.device_expr()`); the statements that bind it are traversed",
    "bindings": "what a name or option is bound to (bindings.py)",
    "steps": "training loops, their steps, loaders and barriers (steps.py)",
    "launch": "process groups, launchers and the functions they spawn (launch.py)",
    "ddp_inputs": "what a DDP model's forward is given (ddp_inputs.py)",
    "host_values": "values that live on the host (host_values.py)",
    "device_data": "variables that hold a tensor on the device (device_data.py)",
    "unported": "CUDA-only code no rule ports (unported.py)",
    "cuda_only": "CUDA-only code and libraries, and the imports of them ported to torch's "
                 "equivalents (cuda_only.py)",
}
