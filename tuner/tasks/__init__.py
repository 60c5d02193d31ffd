"""The tunable kernels of a model and the operator class of each."""
