"""The torch.compile door: the backend, the graphs it captures, their partitions and the compiled-graph cache."""
