"""The names transformers and SGLang import from ``torchvision.transforms.functional``."""

import enum

from torchvision import standin


class InterpolationMode(enum.Enum):
    """torchvision 0.28's interpolation modes (values as there): module-level data in
    transformers' ``image_utils`` (a resampling table) and SGLang's ``internvl_utils``."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


pil_to_tensor = standin("torchvision.transforms.functional.pil_to_tensor")
