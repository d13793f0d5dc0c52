"""The published weights' table (vit_einops.pretrained.PRETRAINED) and the shipped ImageNet-1k names, checked
against torchvision's and timm's own, and the Hugging Face route of create_vit(pretrained=True) against a hub
served on 127.0.0.1 through huggingface_hub's own client. Runs in the interop environment (.ci/run-interop);
elsewhere it skips with the reason."""

from __future__ import annotations

import hashlib

import pytest
import torch
from _interop import TINY, interop_library, perturbed

interop_library("torchvision")
timm = interop_library("timm")
interop_library("huggingface_hub")

import torchvision.models as tvm  # noqa: E402
from _loopback import closed_port_url, serve  # noqa: E402
from safetensors.torch import save as safetensors_save  # noqa: E402
from torchvision.models._meta import _IMAGENET_CATEGORIES  # noqa: E402

from vit_einops import ViT, create_vit  # noqa: E402
from vit_einops._download import DownloadError  # noqa: E402
from vit_einops.imagenet import imagenet1k_classes  # noqa: E402
from vit_einops.interop import to_timm  # noqa: E402
from vit_einops.pretrained import PRETRAINED, TORCHVISION_URL, PublishedWeights, weights_url  # noqa: E402
from vit_einops.preprocess import Preprocessing  # noqa: E402
from vit_einops.presets import PRESETS  # noqa: E402
from vit_einops.presets import TIMM_ARCHS  # noqa: E402
from vit_einops.presets import TIMM_NAMES as PRESET_TIMM_NAMES  # noqa: E402

TORCHVISION_NAMES = [name for name, w in PRETRAINED.items() if w.library == "torchvision"]
TIMM_NAMES = [name for name, w in PRETRAINED.items() if w.library == "timm"]


def test_shipped_names_are_torchvisions_and_every_name_with_weights_is_a_preset():
    assert imagenet1k_classes() == list(_IMAGENET_CATEGORIES)
    assert TORCHVISION_NAMES == ["vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14"]
    families = {*TIMM_ARCHS, "vit_small_patch16_224.dino", "vit_base_patch16_224.mae"}
    assert set(TIMM_NAMES) == set(PRESET_TIMM_NAMES) | families


@pytest.mark.parametrize("name", TORCHVISION_NAMES)
def test_torchvision_entries_are_torchvisions_default_weights(name, monkeypatch):
    monkeypatch.delenv("VIT_EINOPS_WEIGHTS_URL", raising=False)
    default = tvm.get_model_weights(name).DEFAULT
    ours = PRETRAINED[name]
    assert weights_url(name) == default.url and weights_url(name).startswith(TORCHVISION_URL)
    assert default.url.endswith(f"-{ours.sha256_prefix}.pth")  # torch.hub's HASH_REGEX reads the same prefix
    transform = default.transforms()
    assert ours.preprocessing == Preprocessing(
        resize=transform.resize_size[0],
        crop=(transform.crop_size[0],) * 2,
        interpolation=transform.interpolation.value,
        mean=tuple(transform.mean),
        std=tuple(transform.std),
    )
    assert (ours.image_size,) * 2 == default.meta["min_size"]
    assert ours.num_classes == len(default.meta["categories"])


@pytest.mark.parametrize("name", TIMM_NAMES)
def test_timm_entries_are_timms_default_tags(name, monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    cfg = timm.models.get_pretrained_cfg(name).to_dict()
    ours = PRETRAINED[name]
    assert ours.file == cfg["hf_hub_id"] and (cfg.get("hf_hub_filename") or "model.safetensors") == "model.safetensors"
    assert weights_url(name) == f"https://huggingface.co/{cfg['hf_hub_id']}/resolve/main/model.safetensors"
    assert (3, ours.image_size, ours.image_size) == cfg["input_size"] and ours.num_classes == cfg["num_classes"]
    assert ours.preprocessing == Preprocessing.timm(
        crop=ours.image_size, crop_pct=cfg["crop_pct"], interpolation=cfg["interpolation"], mean=cfg["mean"],
        std=cfg["std"],
    )


# --- the hub route, against huggingface_hub's own client and a hub on 127.0.0.1 ---

NAME = "vit_tiny_test"
REPO = "timm/vit_tiny_test.tag"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A hub on 127.0.0.1 serving REPO's model.safetensors as the real hub does: HEAD gives the commit, the ETag
    (the sha256 of an LFS file) and the size; GET gives the bytes."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setitem(PRESETS, NAME, {**TINY, "num_classes": 1000})
    monkeypatch.setitem(
        PRETRAINED, NAME, PublishedWeights("timm", REPO, 32, 1000, Preprocessing.timm(32, 0.9))
    )
    with serve() as site:
        monkeypatch.setenv("HF_ENDPOINT", site.url)
        yield site


def _put(site, data: bytes, etag: str) -> None:
    path = f"{REPO}/resolve/main/model.safetensors"
    site.files[path] = data
    site.headers[path] = {"ETag": f'"{etag}"', "X-Repo-Commit": "a" * 40, "X-Linked-Etag": f'"{etag}"',
                          "X-Linked-Size": str(len(data))}


def test_hub_download_loads_converts_and_names_classes(hub, tmp_path):
    model = perturbed(ViT(**{**TINY, "num_classes": 1000}))
    data = safetensors_save(to_timm(model), metadata={"format": "pt"})
    _put(hub, data, hashlib.sha256(data).hexdigest())
    loaded = create_vit(NAME, pretrained=True)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    assert loaded.class_names[:2] == ["tench", "goldfish"] and loaded.preprocessing == Preprocessing.timm(32, 0.9)
    assert loaded.source["url"] == f"{hub.url}/{REPO}/resolve/main/model.safetensors"
    gets = [r for r in hub.requests if r[0] == "GET"]
    create_vit(NAME, pretrained=True)
    assert [r for r in hub.requests if r[0] == "GET"] == gets  # cached: no second download


def test_a_family_downloads_with_its_arch_and_preprocessing(hub, monkeypatch):
    """create_vit("vit_small_patch14_reg4_dinov2", pretrained=True): the file comes from the family's hub repo,
    loads with the name as its arch (registers, LayerScale, positions for the patches only, no classifier) and
    records DINOv2's preprocessing (ImageNet mean and std, crop 1.0). The architecture is shrunk in the table, so
    the served file is tiny."""
    from vit_einops.pretrained import _timm_family

    name = "vit_small_patch14_reg4_dinov2"
    small = dict(dim=32, depth=1, heads=2, mlp_dim=64, image_size=28)
    monkeypatch.setitem(TIMM_ARCHS, name, {**TIMM_ARCHS[name], **small})
    published = _timm_family(name)
    monkeypatch.setitem(PRETRAINED, name, published)
    model = perturbed(create_vit(name))
    data = safetensors_save(to_timm(model), metadata={"format": "pt"})
    path = f"{published.file}/resolve/main/model.safetensors"
    hub.files[path] = data
    hub.headers[path] = {"ETag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Repo-Commit": "a" * 40,
                         "X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Linked-Size": str(len(data))}
    loaded = create_vit(name, pretrained=True)
    assert published.file == "timm/vit_small_patch14_reg4_dinov2.lvd142m"
    assert loaded.config == model.config and loaded.config.prefix_tokens[1:] == ("reg1", "reg2", "reg3", "reg4")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    assert loaded.preprocessing == Preprocessing.timm(28, 1.0, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    assert loaded.class_names is None and loaded.source["pretrained"] == name


def test_hub_download_whose_sha256_is_not_its_etag_is_refused_and_removed(hub, tmp_path):
    data = safetensors_save(to_timm(ViT(**{**TINY, "num_classes": 1000})), metadata={"format": "pt"})
    _put(hub, data, "0" * 64)
    with pytest.raises(DownloadError, match=r"refused .*model.safetensors: its sha256 [0-9a-f]{16}\.\.\. is not its "
                       r"ETag 0000000000000000"):
        create_vit(NAME, pretrained=True)
    assert [p for p in (tmp_path / "hf").rglob("*") if p.is_file() and "blobs" in p.parts] == []


def test_hub_offline_is_one_line(hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", url := closed_port_url())
    with pytest.raises(DownloadError) as caught:
        create_vit(NAME, pretrained=True)
    message = str(caught.value)
    assert message.startswith(f"create_vit('{NAME}', pretrained=True) could not fetch {url}/{REPO}/")
    assert "weights=" in message and "\n" not in message and caught.value.__cause__ is None
