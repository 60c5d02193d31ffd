"""The torch.compile door: the backend, the graphs it captures and the compiled-graph cache.

A graph TVM's importer takes only in part is cut by ``tuner.partition.split``."""
