"""bfloat16's lowering: which products compute from bf16 operands, their kernels, pools and rounding."""
