"""``create_vit(name, pretrained=True)``: a preset with its published weights, their preprocessing and class names.

Each name's weights are stated once, in :data:`PRETRAINED`:

- torchvision's names (vit_b_16 ...) take torchvision's default ImageNet-1k weights, from the URLs and with the
  transforms of ``torchvision.models.ViT_*_Weights.DEFAULT``. They are cached where torch.hub caches them
  (``torch.hub.get_dir()/checkpoints``, under ``$TORCH_HOME``), so a file torchvision already downloaded is reused.
  The file name carries the first hex digits of its sha256 (torch.hub's convention); a download whose hash differs,
  or that is cut short, is refused and nothing is cached (:mod:`vit_einops.base.download`).
- timm's names (vit_base_patch16_224 ...) take timm's default pretrained tag (its ``pretrained_cfg``), the
  ``model.safetensors`` of ``timm/<name>.<tag>`` on the Hugging Face hub, cached in the hub's cache layout
  (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``), so a file timm or huggingface_hub
  downloaded is reused and ours are reused by them. The hub's answer is checked by our rules before anything is
  written, and a new download's sha256 must equal its ETag (:func:`vit_einops.base.download.download_hub_file`).
  ``$HF_HUB_OFFLINE=1`` reads the cache only.

Every download is capped at the size its architecture implies (:func:`download_limit`) and has a deadline: 60 s
plus 1 s per 128 KiB of that size, or the time in ``$VIT_EINOPS_DOWNLOAD_DEADLINE`` ("30", "90s", "2min", "1h"). A
download not complete by then, one that falls behind that rate after its first 60 s (under the default), or one
whose server sends nothing for 60 s fails with an error naming the URL and the time, and leaves nothing in the
cache (:mod:`vit_einops.base.download`).

``$VIT_EINOPS_WEIGHTS_URL`` replaces torchvision's base URL and ``$HF_ENDPOINT`` the hub's (mirrors, and the tests'
server on 127.0.0.1). ``create_vit(name, weights=PATH)`` loads a local file or directory in any form
:func:`vit_einops.load_model` reads, and checks it holds the named architecture (a timm file is read with
``arch=name``). timm's families (``vit_small_patch14_reg4_dinov2``, ``vit_base_patch16_clip_224.openai``...:
:data:`vit_einops.presets.FAMILIES`) download from the hub in the same way.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base.io import sha256_of
from .base.text import printable
from .network.config import ViTConfig
from .preprocess import Preprocessing
from .presets import (
    FAMILIES,
    PRESETS,
    create_architecture,
    default_tag,
    family_of,
    preset_config,
    timm_arch,
    timm_preprocessing,
)
from .network.sizes import parameter_count

if TYPE_CHECKING:
    from .network.model import ViT

TORCHVISION_URL = "https://download.pytorch.org/models"
WEIGHTS_URL_ENV = "VIT_EINOPS_WEIGHTS_URL"
HF_FILE = "model.safetensors"
# What a weights file holds beside its float32 tensors: torch.save's zip and pickle records (torchvision's largest,
# vit_h_14's, is 2416.643 MiB, its meta's _file_size, for 2416.498 MiB of tensors) or a safetensors header (about
# 100 bytes a tensor). Beside the tensors' size, it is all a server may send more.
CONTAINER_MARGIN = 1 << 20
_HASH = re.compile(r"-([0-9a-f]{8,})\.")  # torch.hub's HASH_REGEX: "vit_b_16-c867db91.pth" -> "c867db91"


@dataclass(frozen=True)
class PublishedWeights:
    """Where a name's weights are published and what they expect.

    Args:
        library: "torchvision" (a file at torchvision's URL) or "timm" (a Hugging Face hub repository).
        file: torchvision's file name (its sha256 prefix inside), or the hub repository "timm/<name>.<tag>".
        image_size: the resolution the weights were trained at (torchvision's vit_h_14 is 518).
        num_classes: their classifier's size (0: a feature extractor, as timm's in21k-only tags are).
        preprocessing: their eval transform, as the library's own (``Weights.transforms()``, timm's data config).
    """

    library: str
    file: str
    image_size: int
    num_classes: int
    preprocessing: Preprocessing

    @property
    def sha256_prefix(self) -> str | None:
        match = _HASH.search(self.file) if self.library == "torchvision" else None
        return match[1] if match else None


def _tv(file: str, size: int, resize: int, interpolation: str = "bilinear") -> PublishedWeights:
    return PublishedWeights("torchvision", file, size, 1000, Preprocessing.torchvision(size, resize, interpolation))


def _timm(name: str) -> PublishedWeights:
    """timm's weights of ``name`` at its default tag (timm's own), or of "name.tag": size, classes, preprocessing and
    hub repository as its family states them (:data:`vit_einops.presets.FAMILIES`)."""
    base, _, tag = name.partition(".")
    tag = tag or default_tag(base)
    fields = timm_arch(f"{base}.{tag}")
    repo = family_of(name).hub_repos.get(base, base)
    return PublishedWeights(
        "timm", f"timm/{repo}.{tag}", fields["image_size"], fields["num_classes"], timm_preprocessing(f"{base}.{tag}")
    )


PRETRAINED: dict[str, PublishedWeights] = {
    # torchvision.models.ViT_*_Weights.DEFAULT: IMAGENET1K_V1, except vit_h_14's (IMAGENET1K_SWAG_E2E_V1, 518 px)
    "vit_b_16": _tv("vit_b_16-c867db91.pth", 224, 256),
    "vit_b_32": _tv("vit_b_32-d86f8d99.pth", 224, 256),
    "vit_l_16": _tv("vit_l_16-852ce7e3.pth", 224, 242),
    "vit_l_32": _tv("vit_l_32-c7638314.pth", 224, 256),
    "vit_h_14": _tv("vit_h_14_swag-80465313.pth", 518, 518, "bicubic"),
    # timm's names at their default tag (timm 1.0's pretrained_cfg), and the tags of the families that are tags of
    # another's names (DINO, MAE)
    **{name: _timm(name) for family in FAMILIES.values() for name in family.members},
    **{f"{name}.{tag}": _timm(f"{name}.{tag}") for family in FAMILIES.values() if not family.members
       for name, tags in family.tags.items() for tag in tags},  # fmt: skip
}


def create_vit(
    name: str, *, pretrained: bool = False, weights: str | os.PathLike | None = None, **overrides: Any
) -> ViT:
    """Preset ``name`` (see :func:`~vit_einops.list_presets`; timm's names work too), as timm's ``create_model``:

    - by default, freshly initialised; any :class:`~vit_einops.ViT` keyword overrides the preset;
    - ``pretrained=True``: with its published weights (:data:`PRETRAINED`), downloaded once and verified, with their
      preprocessing (``model.transforms()``) and ImageNet-1k class names;
    - ``weights=PATH``: with the weights in a local file or directory of any form :func:`~vit_einops.load_model`
      reads (a torchvision ``.pth``, timm or vit-einops ``.safetensors``, a Hugging Face directory...); a file that
      holds another architecture is refused with the fields that differ.

    With weights, ``num_classes`` replaces the classifier (a new zero head, as ``reset_classifier``), and the other
    ``overrides`` are fields no tensor holds (``dropout``, ``attn_impl``, ``dtype``...).
    """
    if not isinstance(pretrained, bool):
        raise TypeError(f"pretrained must be True or False, got {pretrained!r}")
    if not pretrained and weights is None:
        return create_architecture(name, **overrides)
    if pretrained and weights is not None:
        raise ValueError("pass pretrained=True (the published weights) or weights=PATH (a local file), not both")
    expected = preset_config(name)  # checks the name
    num_classes = overrides.pop("num_classes", None)
    if weights is not None:
        model = _load_local(name, weights, overrides)
    else:
        model = _load_published(name, overrides)
    _check_architecture(model, name, expected, weights)
    if num_classes is not None and num_classes != model.config.num_classes:
        model.reset_classifier(num_classes)
    return model


def _load_local(name: str, weights: str | os.PathLike, overrides: dict[str, Any]) -> ViT:
    from .sources import detect_source, existing_model_path, load_model

    path = existing_model_path(weights, "weights")
    source = detect_source(path)
    # What a state dict cannot tell, the name does: a timm name all of it (h, act, eps...: arch=), ours h.
    if source == "timm" and name not in PRESETS:
        overrides = {"arch": name, **overrides}
    elif source in ("torchvision", "timm"):
        overrides = {"heads": preset_config(name)["heads"], **overrides}
    return load_model(path, source=source, **overrides)


def _load_published(name: str, overrides: dict[str, Any]) -> ViT:
    from .sources import load_model

    if name not in PRETRAINED:
        raise ValueError(
            f"no published weights for {name!r}; names with weights: {', '.join(PRETRAINED)}. "
            f"Use weights=PATH for a local file"
        )
    published = PRETRAINED[name]
    if published.library == "torchvision":
        kwargs: dict[str, Any] = {"heads": preset_config(name)["heads"]}  # a state dict cannot tell h; the name does
        path, origin = _fetch_torchvision(name, published)
    else:
        # A timm name tells what no tensor holds (h, act, eps, pooling) and what the file must fit (arch=).
        kwargs = {"heads": preset_config(name)["heads"], "global_pool": "token"} if name in PRESETS else {"arch": name}
        path, origin = _fetch_hub(name, published)
    try:
        model = load_model(path, source=published.library, **{**kwargs, **overrides})
    except ValueError as err:
        _check_cached_file(path, published, err)
        raise
    model.preprocessing = published.preprocessing
    model.source = {**(model.source or {}), "pretrained": name, "url": origin}
    if model.class_names is not None:
        model.source["class_names"] = f"ImageNet-1k: the published {name} weights' classes"
    return model


def weights_url(name: str) -> str:
    """The URL ``create_vit(name, pretrained=True)`` downloads (``$VIT_EINOPS_WEIGHTS_URL`` and ``$HF_ENDPOINT``
    replace the default hosts)."""
    published = PRETRAINED[name]
    if published.library == "torchvision":
        return f"{os.environ.get(WEIGHTS_URL_ENV, TORCHVISION_URL).rstrip('/')}/{published.file}"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    return f"{endpoint}/{published.file}/resolve/main/{HF_FILE}"


def _offline_hint(name: str, url: str, reason: str, file: str) -> str:
    # A timm file's tensors do not tell every field (heads, act, eps, pooling): the command names the arch, as
    # create_vit(name, weights=...) does.
    timm = f" --from timm --arch {name}" if PRETRAINED[name].library == "timm" else ""
    return (
        f"create_vit({name!r}, pretrained=True) could not fetch {printable(url)}: {reason.rstrip('.')}. Without "
        f"network, download that file elsewhere and pass it: create_vit({name!r}, weights={file!r}), or convert it "
        f"once with `vit-einops convert {file} {name}.safetensors{timm}`"
    )


def download_limit(name: str) -> int:
    """The most bytes ``name``'s published weights file can be, from its architecture alone: its parameters
    (:func:`vit_einops.network.sizes.parameter_count` at the weights' image size and classes) as float32, and
    :data:`CONTAINER_MARGIN`. No server may declare or send more."""
    published = PRETRAINED[name]
    config = preset_config(name, image_size=published.image_size, num_classes=published.num_classes)
    return 4 * parameter_count(ViTConfig(**config)) + CONTAINER_MARGIN


def _fetch_torchvision(name: str, published: PublishedWeights) -> tuple[Path, str]:
    import torch.hub

    from .base.download import DownloadError, download

    url = weights_url(name)
    path = Path(torch.hub.get_dir()) / "checkpoints" / published.file
    if not path.is_file():
        try:
            download(url, path, sha256_prefix=published.sha256_prefix, max_bytes=download_limit(name))
        except DownloadError as err:
            raise DownloadError(_offline_hint(name, url, _reason(err, url), published.file)) from None
    return path, url


def _fetch_hub(name: str, published: PublishedWeights) -> tuple[Path, str]:
    from .base.download import DownloadError, cached_hub_file, download_hub_file

    url = weights_url(name)
    repo = _hub_cache() / f"models--{published.file.replace('/', '--')}"  # huggingface_hub's repo_folder_name
    cached = cached_hub_file(repo, HF_FILE)
    if cached is not None:
        return cached, url
    if os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE"):  # as huggingface_hub
        reason = f"HF_HUB_OFFLINE is set and the file is not in the hub cache ({printable(repo)})"
        raise DownloadError(_offline_hint(name, url, reason, HF_FILE))
    try:
        return download_hub_file(url, repo, HF_FILE, max_bytes=download_limit(name)), url
    except DownloadError as err:
        raise DownloadError(_offline_hint(name, url, _reason(err, url), HF_FILE)) from None


def _hub_cache() -> Path:
    """The Hugging Face hub's cache folder, as huggingface_hub finds it: ``$HF_HUB_CACHE``, else
    ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``. Read at each call,
    so a variable set after import counts."""
    cache = os.environ.get("HF_HUB_CACHE")
    if not cache:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface"
        )
        cache = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def _reason(err: OSError, url: str) -> str:
    """A download error's message without its leading "could not download URL: ", for the offline hint."""
    return str(err).removeprefix(f"could not download {printable(url)}: ")


def _check_cached_file(path: Path, published: PublishedWeights, err: ValueError) -> None:
    """A cached file is used without hashing it again (hundreds of MB at every call), so one damaged after its
    download (a copy cut short, an error page saved under its name) fails to load at every call: say so, and how
    to fetch it again. A torchvision file's name carries a prefix of its sha256; a hub file links to a blob named by
    its sha256."""
    if published.library != "torchvision":
        path = path.resolve()
    prefix = published.sha256_prefix if published.library == "torchvision" else path.name
    if prefix is not None and not _sha256(path).startswith(prefix):
        raise ValueError(
            f"{path}: the cached download of these weights is damaged (its sha256 does not start with {prefix}, as "
            f"its name says): delete it to download it again ({err})"
        ) from err


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return sha256_of(f)


def _check_architecture(model: ViT, name: str, expected: dict[str, Any], weights: Any) -> None:
    from .network.config import FIELDS, ViTConfig, differences

    # The fields the name promises: all but the free ones and those a checkpoint may change (a fine-tuned file's
    # image size and classes).
    promised = [field for field, about in FIELDS.items() if not (about.free or about.per_checkpoint)]
    differ = [
        f"{field} {got!r} (a {name} has {wanted!r})"
        for field, got, wanted in differences(model.config, ViTConfig(**expected), promised)
    ]
    if differ:
        where = weights if weights is not None else "the published weights"
        raise ValueError(
            f"{where}: not a {name}: {', '.join(differ)}; load it as it is with load_model(path), or name the "
            f"preset it matches"
        )
