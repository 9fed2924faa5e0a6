"""`tpukit verify`: run a script and its port side by side and compare every training step's
loss (command.py), each side in a process of its own (child.py), compared by compare.py."""
