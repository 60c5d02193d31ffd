"""CUDA on a host: the runtime, the compile environment, what a built artifact holds, which errors poison a context."""
