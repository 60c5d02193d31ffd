"""The environment variables that prepare a worker process at start-up, set by whoever starts it
(the engine, a Ray node) and read by ``measure.workers.main`` before it imports anything heavy."""

RUN_DEVICE_ENV = "TENSOR_TUNER_RUN_DEVICE"  # a measuring worker's device ("cpu" or "cuda"), prepared at start-up
CUDA_BUILD_ENV = "TENSOR_TUNER_CUDA_BUILD"  # "1": a build worker compiles for CUDA (set up before `import tvm`)
