"""``torchvision.transforms``: only ``InterpolationMode``. SGLang's ``internvl_utils`` reads
``T.Compose`` and the transforms when its ``build_transform`` runs, which the tested path
never calls (an ``AttributeError`` there says so)."""

from torchvision.transforms.functional import InterpolationMode

__all__ = ["InterpolationMode"]
