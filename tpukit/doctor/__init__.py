"""`tpukit doctor`: a pre-flight check of the environment, the device, and the code."""
