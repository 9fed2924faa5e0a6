"""Training and eval loops: MpDeviceLoader for DataLoader loops, a step barrier for manual
batching, and what would recompile or sync in the hot loop.

XLA traces a step lazily and runs it when the graph is cut. MpDeviceLoader cuts it once per
batch (and overlaps the host-to-device copy); a loop that batches by hand must call
`torch_xla.sync()` once per step itself, or the graph grows across steps.
"""
