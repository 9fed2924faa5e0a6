"""Mixed precision: fp16 autocast becomes bf16 autocast on XLA; GradScaler goes away.

TPUs compute in bfloat16, which has float32's exponent range: gradients do not underflow,
so loss scaling is not needed, and every GradScaler call has a plain equivalent.
"""
