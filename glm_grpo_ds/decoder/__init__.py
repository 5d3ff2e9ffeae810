"""The frozen image decoder: prior tokens -> images with GLM-Image's DiT + VAE + glyph encoder.

* image_decoder.py: :class:`ImageDecoder` (diffusers' pipeline without its AR, one prompt per DiT batch);
* settings.py: :class:`DecodeSettings` (steps, guidance, guided steps) and the pipeline's own defaults;
* compute.py: how the DiT computes (``decoder.attention``, ``decoder.fp8``) and what a device cannot run;
* fp8.py: the FP8 linear layers (torch only).
"""

from .image_decoder import ImageDecoder
from .settings import DecodeSettings, pipeline_call_defaults, resolve_settings

__all__ = ["DecodeSettings", "ImageDecoder", "pipeline_call_defaults", "resolve_settings"]
