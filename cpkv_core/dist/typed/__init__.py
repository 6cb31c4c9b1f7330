"""Typed data: values as JSON plus raw bytes, checked against their annotations; never a pickle.

Entry points: ``encode_frame`` / ``decode_frame`` (what ranks send their launcher, and host
metadata between ranks) and ``codec_for`` (the JSON conversion the PD wire uses too).
"""

from cpkv_core.dist.typed.codec import Codec, codec_for
from cpkv_core.dist.typed.frames import MAGIC, FrameError, decode_frame, encode_frame
from cpkv_core.dist.typed.nodes import TAG, CodecError, type_name
from cpkv_core.dist.typed.tensor_data import DTYPES, TensorData, from_data, to_data

__all__ = [
    "DTYPES",
    "MAGIC",
    "TAG",
    "Codec",
    "CodecError",
    "FrameError",
    "TensorData",
    "codec_for",
    "decode_frame",
    "encode_frame",
    "from_data",
    "to_data",
    "type_name",
]
