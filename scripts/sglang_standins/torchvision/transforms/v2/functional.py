"""``torchvision.transforms.v2.functional``: transformers reads its functions when an image
processor runs, which the tested path never does."""

from torchvision.transforms.functional import InterpolationMode

__all__ = ["InterpolationMode"]
