"""Rule code, registered by code (or by a rule file's `engine` for table-driven rules)."""


def load_transforms() -> None:
    from tpukit.migrate.transforms import (  # noqa: F401 - imported to register
        amp,
        api_map,
        backend_flags,
        checkpoints,
        collectives,
        cuda_only,
        devices,
        distributed,
        element_reads,
        generic,
        grad_mode,
        hot_loop,
        loops,
        optimizer_device,
        slices,
        typed_tensors,
    )
