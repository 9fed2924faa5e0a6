"""Collectives the XLA process group does not take: `dist.all_reduce(t, op=dist.ReduceOp.AVG)`
raises `ValueError: Invalid reduce op` on the "xla" backend (torch_xla 2.9, checked at world
size 1), so a DDP script that averages its loss for logging (llm.c's train_gpt2.py) dies at
its first step. A sum divided by the world size is the same average."""
