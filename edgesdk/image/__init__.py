"""Offline provisioning images: ``edgesdk image build`` (wheelhouse, overlay, config, install.sh)."""

from edgesdk.image.builder import BuiltImage, ImageOptions, build_image

__all__ = ["BuiltImage", "ImageOptions", "build_image"]
