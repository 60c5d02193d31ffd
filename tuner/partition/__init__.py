"""A torch model TVM's importer takes only in part, in pieces around the operators it refuses.

``split`` cuts it (both doors use it; the torch.compile door caches each piece itself); ``pieces`` tunes
the pieces for ``tune()``, sharing the budget; ``result`` hands back the whole, the refused operators
running in PyTorch between the compiled pieces."""
