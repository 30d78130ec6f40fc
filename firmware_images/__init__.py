"""Firmware recipes per device family, shipped as package data (``edgesdk.firmware_images``).

Each family folder holds ``recipe.yaml`` (which profiles it fits, which groups the agent's
user joins) and ``overlay/`` (files copied onto the device's root filesystem). ``common/``
holds what every family shares: ``install.sh`` and the directory layout. ``edgesdk image
build`` (``edgesdk.image``) reads them; see README.md beside this file.
"""
