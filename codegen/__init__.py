"""Code generation: tensor intrinsics, micro-kernels and TIR passes for design spaces, lowering and builds."""
