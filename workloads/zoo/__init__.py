"""Model definitions in plain PyTorch (no torchvision): the built-in models' architectures.

Imported only when a model is built, so the tuner works without torch for everything else.
"""
