"""The preprocessor_config.json save_hf writes for each family, read by transformers' AutoImageProcessor: its own
class (BitImageProcessor for DINOv2, CLIPImageProcessor, SiglipImageProcessor, DeiTImageProcessor,
ViTImageProcessor) makes the same tensor as the model's preprocessing, within 1e-6, with the torch backend
(transformers' default) and, for a preprocessing that resizes with PIL and does not crop, with
``backend="pil"``. Runs in
.ci/run-interop's venv, skips elsewhere.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _interop import interop_library
from PIL import Image
from test_hf_export_processor import EXPORTS, _model

from vit_einops.interop import save_hf

transformers = interop_library("transformers")


# (architecture, backend): every family resizing with torch; with PIL, the ones without a crop (after a PIL resize,
# transformers centres an odd margin otherwise than torchvision and timm, and save_hf writes no processor).
CASES = [(arch, "torch") for arch in EXPORTS] + [(arch, "pil") for arch, (_, p, _) in EXPORTS.items() if p.crop is None]


@pytest.mark.parametrize(("arch", "backend"), CASES)
def test_transformers_reads_each_family_processor_to_the_same_tensor(tmp_path, arch, backend):
    usual = EXPORTS[arch][1]
    model = _model(arch, dataclasses.replace(usual, backend=backend))
    directory = save_hf(model, tmp_path / arch)
    theirs = transformers.AutoImageProcessor.from_pretrained(
        directory, backend="torchvision" if backend == "torch" else "pil"
    )
    assert type(theirs).__name__ == EXPORTS[arch][2] + ("" if backend == "torch" else "Pil")
    rng = np.random.default_rng(0)
    for height, width in [(45, 77), (30, 20)]:  # wide and tall: margins of odd and even widths around the crops
        image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        expected = theirs(image, return_tensors="pt")["pixel_values"][0]
        ours = model.preprocessing(image)
        assert ours.shape == expected.shape
        assert (ours - expected).abs().max().item() <= 1e-6, (arch, backend, height, width)


def test_the_registrys_processors_are_transformers_own():
    """Each architecture's image processor in the family registry is the one transformers' AutoImageProcessor
    pairs with its model_type (a vision tower's, that of its whole model; DINOv2 with registers, DINOv2's), on
    torch's backend (transformers 5 maps each type to a processor per backend)."""
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    from vit_einops.interop.hf_families import HF_ARCHITECTURES
    from vit_einops.presets import HF_PROCESSORS

    mapped_as = {"clip_vision_model": "clip", "siglip_vision_model": "siglip", "dinov2_with_registers": "dinov2"}
    for arch, processor in HF_PROCESSORS.items():
        model_type = "deit" if arch.startswith("DeiT") else HF_ARCHITECTURES[arch].model_types[0]  # DeiT reads "vit" too
        assert IMAGE_PROCESSOR_MAPPING_NAMES[mapped_as.get(model_type, model_type)]["torchvision"] == processor, arch
