"""``torchvision.transforms.v2``: transformers imports its ``functional`` module."""
