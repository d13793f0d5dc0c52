"""Which device a tool runs on: the one check of a device name, with an error that says what is missing."""

from __future__ import annotations

import os

import torch


def cuda_missing() -> str | None:
    """Why CUDA cannot be used here, in one phrase, or None when at least one CUDA device is visible.

    Two different fixes, so two messages: a torch built without CUDA (install a CUDA build) and a CUDA build that
    sees no GPU (no driver, no device, or CUDA_VISIBLE_DEVICES hiding them).
    """
    if torch.version.cuda is None:
        return f"this torch {torch.__version__} was built without CUDA"
    if torch.cuda.device_count() == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hidden = f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device (no GPU or driver{hidden})"
    return None


def resolve_device(device: str | torch.device) -> torch.device:
    """ "auto" -> CUDA when available, else CPU; "cpu", "cuda", "cuda:1" or a torch.device as given.

    Refused (ValueError): a name torch does not parse, a device other than cpu or cuda, CUDA where
    :func:`cuda_missing` gives a reason, and a CUDA index past the visible devices.
    """
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device must be 'auto', a device string or a torch.device, got {type(device).__name__}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"unknown device {device!r}; expected 'auto', 'cpu', 'cuda' or 'cuda:N'") from err
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r} is not supported; expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if resolved.type == "cuda":
        missing = cuda_missing()
        if missing:
            raise ValueError(f"device {device!r} asked for CUDA, but {missing}")
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise ValueError(f"device {device!r}: torch sees {count} CUDA device(s), numbered 0 to {count - 1}")
    return resolved
