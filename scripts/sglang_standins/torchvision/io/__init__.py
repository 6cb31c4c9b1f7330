"""The names transformers' ``image_utils`` imports from ``torchvision.io``."""

import enum

from torchvision import standin


class ImageReadMode(enum.Enum):
    """torchvision 0.28's read modes (values as there)."""

    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4


decode_image = standin("torchvision.io.decode_image")
