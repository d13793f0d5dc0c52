"""The Vision Transformer: PatchEmbedding (Eq. 1) -> TransformerEncoder (Eqs. 2-3) -> ClassificationHead (Eq. 4)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

import inspect

import torch
from einops import rearrange
from torch import nn

from ..base.checks import check_choice, check_dense_tensor, check_index, check_nonnegative_int, check_positive_int
from ..base.init import trunc_normal_
from ..base.sequential import Sequential
from .attention import attn_impl_of, check_kernels_move, per_layer_impls, set_attn_impl
from .blocks import TransformerEncoder, TransformerEncoderBlock
from .config import FIELDS, ViTConfig
from .head import ClassificationHead, head_swap_help
from .patch_embed import PatchEmbedding
from .probes import ActivationCache, Hook, HookPoint, attached, chosen_sites, unknown_site
from ..preprocess import Preprocessing
from .rope import RopeTable, RotaryEmbedding
from .sizes import check_model_build_time, check_model_memory

# timm's default for every Linear in the encoder and head; the embeddings have their own init.
LINEAR_INIT_STD = 0.02
# reset_classifier's global_pool: timm's names ("token", "avg") and ours -> our pool.
RESET_POOLS = {"token": "cls", "avg": "mean", "cls": "cls", "mean": "mean"}
OUTPUT_FORMATS = ("NCHW", "NLC")


class ViT(Sequential):
    """Vision Transformer (Dosovitskiy et al. 2021), children ``patch_embed``, ``blocks``, ``head``.

    Every argument is keyword-only and is a field of :class:`ViTConfig` (see there for the defaults' sources),
    but ``attn_impl``: the attention path each layer runs ("einsum", "chunked", "sdpa"; one for all, or one per
    layer), which is runtime state, not architecture. Switch it with :meth:`set_attn_impl` or one layer's
    ``blocks[i].attn.mha.impl``; ``model.attn_impl`` reads it.

    ``model.config`` describes the model as it is after the changes a built model takes (``reset_classifier``,
    ``model.head.fc = nn.Linear(...)``, blocks cut off) and always rebuilds it: ``ViT.from_config(model.config)``
    has the same structure and state-dict keys.

    timm's interface is here too: ``forward_features``, ``forward_head``, ``reset_classifier``,
    ``get_classifier``, ``num_classes``, ``num_features``, ``no_weight_decay``, ``forward_intermediates``,
    ``get_intermediate_layers``. TransformerLens's too: every activation a study reads has a named probe site
    (:meth:`probe_sites`, docs/probes.md), read with :meth:`run_with_cache` and changed with :meth:`run_with_hooks`.

    Shapes: (b, C, H, W) float -> (b, num_classes) logits (or (b, D) pooled features when num_classes is 0).
    A batch of another float dtype is cast to the model's when the cast is exact (float16 or bfloat16 into a
    float32 model) and refused with a TypeError otherwise (float64 into float32 would round). Non-finite pixels
    are not checked: they make that image's logits non-finite and leave the other images of the batch unchanged.
    The forward pass computes the model and nothing else: the memory a batch needs is checked once by the entry
    points that take untrusted sizes (:func:`vit_einops.predict`, the study functions, the commands) with
    :func:`vit_einops.network.sizes.check_model_forward`, which a caller of ``model(x)`` may call too. Construction
    refuses a config past the memory or build-time budget (:mod:`vit_einops.base.budget`).
    """


    def __init__(self, *, attn_impl: str | Sequence[str] = "einsum", **fields: Any) -> None:
        # The keywords are ViTConfig's fields (its registry): ViT's signature is made from them below the class.
        unknown = sorted(set(fields) - set(FIELDS))
        if unknown:
            raise TypeError(
                f"ViT got an unexpected keyword argument {unknown[0]!r}; its keywords are ViTConfig's fields "
                f"({', '.join(FIELDS)}) and attn_impl"
            )
        config = ViTConfig(**fields)
        # Checked before anything of the model exists: a config that asks for terabytes, or for more modules than
        # build in the time budget, fails now, not after minutes of building. On the meta device (loaders, counts)
        # only the modules' own memory counts.
        on_meta = torch.empty(0).device.type == "meta"
        check_model_memory(config, 0 if on_meta else torch.get_default_dtype().itemsize)
        check_model_build_time(config)
        impls = per_layer_impls(attn_impl, config.depth)
        super().__init__(
            OrderedDict(
                patch_embed=PatchEmbedding.from_config(config),
                blocks=TransformerEncoder(config),
                head=ClassificationHead(config),
            )
        )
        # EVA-02: the RoPE table of each input's grid, for every block (timm's model.rope); no state, so no module
        self.rope = RotaryEmbedding(config.head_dim, config.rope_grid) if config.rope_grid is not None else None
        self._built_config = config  # model.config starts here (see read_config)
        self.num_prefix_tokens = config.num_prefix_tokens  # timm's name: the class, distillation and register tokens
        # What a model file carries beside the weights (vit_einops.modelfile): plain attributes, set by the loaders
        # and by training, None when unknown.
        self.preprocessing: Preprocessing | None = None  # how an image becomes this model's input
        self.class_names: list[str] | None = None  # one name per logit
        self.source: dict[str, Any] | None = None  # where the weights came from (library, file)
        for module in (self.blocks, self.head):
            for m in module.modules():
                if isinstance(m, nn.Linear):
                    trunc_normal_(m.weight, LINEAR_INIT_STD)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
        set_attn_impl(self, impls)

    @classmethod
    def from_config(cls, config: ViTConfig, *, attn_impl: str | Sequence[str] = "einsum") -> ViT:
        """The ViT of ``config``, running attention ``attn_impl`` (one for every layer, or one per layer)."""
        if not isinstance(config, ViTConfig):
            raise TypeError(f"from_config expects a ViTConfig, got {type(config).__name__}")
        return cls(**{f.name: getattr(config, f.name) for f in fields(config)}, attn_impl=attn_impl)

    @property
    def config(self) -> ViTConfig:
        """The ViTConfig of the model as it is now (see :func:`read_config`)."""
        return read_config(self)

    @config.setter
    def config(self, value: Any) -> None:
        raise AttributeError(
            "model.config describes the model and cannot be assigned; change the model instead "
            "(model.reset_classifier(K)), or build a new one: ViT.from_config(config)"
        )

    @property
    def attn_impl(self) -> str | tuple[str, ...]:
        """The attention path the layers run: one str when they all agree, else a tuple with one per layer."""
        return attn_impl_of(self)

    # -- input -------------------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self._encode(self.check_input(x)))

    def _embed(self, x: torch.Tensor) -> tuple[torch.Tensor, RopeTable | None]:
        """Eq. 1's tokens of a checked batch, and the RoPE table of its patch grid where the model has RoPE."""
        if self.rope is None:
            return self.patch_embed(x), None
        (ph, pw), (h, w) = self.patch_embed.patch_size, x.shape[-2:]
        return self.patch_embed(x), self.rope((h // ph, w // pw), self.num_prefix_tokens, device=x.device)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        """z_L: the encoder's tokens of a checked batch."""
        tokens, rope = self._embed(x)
        return self.blocks(tokens, rope=rope)

    def check_input(self, x: Any) -> torch.Tensor:
        """``x`` as this model runs it, or a TypeError/ValueError saying what was expected.

        Expected: a float (b, C, H, W) tensor of this model's C, H, W, on the model's device. Another float dtype
        is cast to the model's when that is exact (torch.promote_types gives the model's dtype: float16 and
        bfloat16 into float32, float32 into float64); a rounding cast (float64 into float32, float32 into
        float16) is a TypeError naming both dtypes. The rule holds under torch.autocast too, which then casts the
        layers' inputs as it does (it never casts float64, so a float64 batch would fail there anyway).
        """
        pe = self.patch_embed
        c, (h, w) = pe.in_channels, pe.image_size
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor of shape (b, {c}, {h}, {w}), got {type(x).__name__}")
        check_dense_tensor("x", x, values=False)  # a meta x is for the device check below: a meta model takes one
        if not x.is_floating_point():
            raise TypeError(
                f"expected a floating-point image tensor, got dtype {x.dtype} "
                f"(for 0..255 pixels pass x.float() / 255, then normalise as the weights expect)"
            )
        if x.ndim != 4:
            raise ValueError(f"expected a 4-D tensor (b, {c}, {h}, {w}), got {x.ndim}-D of shape {tuple(x.shape)}")
        if x.shape[1] != c:
            raise ValueError(f"expected {c} channels, got {x.shape[1]} (input shape {tuple(x.shape)})")
        if tuple(x.shape[2:]) != (h, w):
            self._check_other_size(x)
        weight = pe.proj.weight
        if x.device != weight.device:
            raise ValueError(
                f"the input is on {x.device} but the model is on {weight.device}; move one of them "
                f"(x.to({str(weight.device)!r}) or model.to({str(x.device)!r}))"
            )
        if x.dtype != weight.dtype:
            if torch.promote_types(x.dtype, weight.dtype) != weight.dtype:
                raise TypeError(
                    f"the input is {x.dtype} but the model is {weight.dtype}, and casting would round the input; "
                    f"pass x.to({weight.dtype}) or convert the model with model.to({x.dtype})"
                )
            x = x.to(weight.dtype)  # exact: every value of x.dtype is a value of the model's dtype
        return x

    def _check_other_size(self, x: torch.Tensor) -> None:
        """Admit an input of another size than the training one when the model resamples E_pos for it
        (``dynamic_size``): H and W positive multiples of the patch size."""
        (h, w), (ph, pw) = self.patch_embed.image_size, self.patch_embed.patch_size
        size = tuple(x.shape[2:])
        dynamic = self.patch_embed.pos_embed.dynamic
        if dynamic is None:
            raise ValueError(
                f"expected height, width ({h}, {w}), got {size} (input shape {tuple(x.shape)}); resize the "
                f"images, or resample the model once (vit_einops.interop.resample_vit(model, {size})), or let it take "
                f"any size by building it with dynamic_size='timm' or 'hf' (E_pos resampled at each forward)"
            )
        if size[0] % ph or size[1] % pw or 0 in size:
            fit = (max(ph, size[0] // ph * ph), max(pw, size[1] // pw * pw))
            raise ValueError(
                f"height, width {size} are not positive multiples of the patch size ({ph}, {pw}); crop or resize "
                f"to e.g. {fit}"
            )

    # -- timm's interface ----------------------------------------------------------------------------------

    @property
    def num_classes(self) -> int:
        """K, the classifier's outputs; 0 when there is no classifier."""
        return self.head.num_classes

    @property
    def has_classifier(self) -> bool:
        """Whether the outputs are class logits (:attr:`ViTConfig.has_classifier`): False for pooled features
        (num_classes 0) and for an embedding projection (CLIP's image embedding). Read off the head, as
        :attr:`num_classes`, so that a model no config describes can still say it."""
        return self.head.num_classes > 0 and not self.head.embedding

    @property
    def num_features(self) -> int:
        """D, the width of the tokens :meth:`forward_features` returns (timm's ``num_features``)."""
        return self.head.dim

    @property
    def head_hidden_size(self) -> int:
        """The width of the classifier's input: D, or representation_size with a pre_logits layer (timm's name)."""
        return self.head.in_features

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The tokens after the encoder and the final LayerNorm: (b, C, H, W) -> (b, N, D), the class token first.

        As timm's ``forward_features``, the tokens are normed (Eq. 4's LN applied to every token; LN acts on each
        token alone, so the class token's row is exactly y of Eq. 4). A model with ``fc_norm`` norms after the
        pooling instead, so its tokens come out un-normed, as in timm.
        """
        x = self._encode(self.check_input(x))
        return self.head.normed(x) if self.head.token_norm else x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """The head on :meth:`forward_features`'s tokens: (b, N, D) -> (b, num_classes) logits, or with
        ``pre_logits=True`` the classifier's input (b, head_hidden_size): pooled, normed, through the tanh
        pre_logits layer when the model has one. ``forward_head(forward_features(x)) == model(x)``.
        """
        dim = self.head.dim
        if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[-1] != dim:
            got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"forward_head expects the (b, n, {dim}) tokens of forward_features, got {got}")
        x = self.head.pool_features(x, normed=True)
        if pre_logits:
            return x.mean(dim=1) if self.head.distilled else x  # DeiT: the mean of the two tokens, as timm's
        return self.head.classify(x)

    def get_classifier(self) -> nn.Module | tuple[nn.Module, nn.Module]:
        """The classifier ``head.fc``: an nn.Linear(head_hidden_size, K), or nn.Identity when K is 0; for a
        distilled model (DeiT) the pair ``(head.fc, head.fc_dist)``, as timm's."""
        return (self.head.fc, self.head.fc_dist) if self.head.distilled else self.head.fc

    def reset_classifier(
        self, num_classes: int, global_pool: str | None = None, *, class_names: Sequence[str] | None = None
    ) -> None:
        """Replace the classifier by a zero-initialised Linear(head_hidden_size, num_classes), as the paper
        fine-tunes (Section 3.2: "a zero-initialized D x K feedforward layer"); 0 leaves none (nn.Identity), so
        the model returns the pooled features.

        Args:
            num_classes: K.
            global_pool: timm's pooling names "token" (the class token) or "avg" (mean of the patch tokens), or
                ours "cls" / "mean"; None keeps the model's.
            class_names: K names of the outputs, stored as ``model.class_names``; None forgets the old ones.
        """
        num_classes = check_nonnegative_int("num_classes", num_classes)
        if global_pool is not None:
            if not isinstance(global_pool, str):
                raise TypeError(
                    f"global_pool must be a str (one of {', '.join(RESET_POOLS)}) or None, got "
                    f"{type(global_pool).__name__}; class names go by keyword: class_names=[...]"
                )
            global_pool = RESET_POOLS[check_choice("global_pool", global_pool, RESET_POOLS)]
            self._check_pool(global_pool)
        names = check_class_names(class_names, num_classes)
        for name in ("fc", "fc_dist") if self.head.distilled else ("fc",):
            if num_classes:
                ref = self.head.norm.weight
                fc = nn.Linear(self.head.in_features, num_classes, device=ref.device, dtype=ref.dtype)
                nn.init.zeros_(fc.weight)
                nn.init.zeros_(fc.bias)
            else:
                fc = nn.Identity()
            setattr(self.head, name, fc)
        if global_pool is not None:
            self.head.pool.mode = global_pool
        self.class_names = names

    def _check_pool(self, pool: str) -> None:
        """ValueError unless the head can switch to ``pool`` ("cls" or "mean") in place."""
        current = self.head.pool.mode
        if pool == current:
            return
        if current == "map":
            raise ValueError(
                "this model pools by attention (pool 'map', a learned module); it cannot switch to another pooling in "
                "place: build one with dataclasses.replace(model.config, pool=...) and load the other weights"
            )
        if pool == "cls" and not self.config.class_token:
            raise ValueError("global_pool 'token' / 'cls' reads the class token, which this model has not")
        if self.head.distilled:
            raise ValueError(
                "a distilled model (DeiT) pools its class and distillation tokens; it has no other pooling"
            )

    def no_weight_decay(self) -> set[str]:
        """Parameter names that weight decay should skip: the class, distillation and register tokens and the
        position embedding (timm's ``cls_token``, ``dist_token``, ``reg_token``, ``pos_embed``), under this model's
        names, so timm's optimizer factory can match them."""
        tokens = ("cls_token", "dist_token", "reg_token", "pos_embed")
        return {f"patch_embed.{name}.weight" for name in tokens if name in self.patch_embed._modules}

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[Any] | tuple[torch.Tensor, list[Any]]:
        """timm's ``forward_intermediates``: the outputs z_l of chosen encoder blocks.

        Args:
            x: (b, C, H, W) images.
            indices: None for every block, an int n for the last n blocks, or a sequence of block indices
                (0-based, negative from the end). Intermediates come in block order.
            return_prefix_tokens: also return each block's prefix tokens (class, distillation, register): a list
                of (patch tokens, (b, num_prefix_tokens, D)).
            norm: apply the final LayerNorm to each (not for a model with fc_norm, whose norm follows pooling).
            stop_early: run no block after the last one asked for (the final features then come from there).
            output_fmt: "NCHW" for (b, D, gh, gw) patch-token maps, "NLC" for (b, N', D) patch tokens.
            intermediates_only: return only the intermediates.

        Returns: (final features as :meth:`forward_features`, intermediates), or the intermediates alone.
        """
        output_fmt = check_choice("output_fmt", output_fmt, OUTPUT_FORMATS)
        take = self._take_indices(indices)
        if norm and not self.head.token_norm:
            raise ValueError("norm=True needs a LayerNorm on every token; this model's (fc_norm=True) follows pooling")
        x = self.check_input(x)
        layout = self.patch_embed.layout(x.shape[-2:])
        x, rope = self._embed(x)
        blocks = list(self.blocks)[: max(take) + 1] if stop_early else self.blocks
        intermediates = []
        for i, block in enumerate(blocks):
            x = block(x, rope=rope)
            if i in take:
                intermediates.append(self.head.norm(x) if norm else x)
        # Each (b, P, D) prefix tokens and (b, gh, gw, D) patches.
        prefix, intermediates = zip(*(layout.split(y, dim=1) for y in intermediates), strict=True)
        pattern = "b h w d -> b d h w" if output_fmt == "NCHW" else "b h w d -> b (h w) d"
        intermediates = [rearrange(y, pattern) for y in intermediates]
        if return_prefix_tokens:
            intermediates = list(zip(intermediates, prefix, strict=True))
        if intermediates_only:
            return intermediates
        return (self.head.normed(x) if self.head.token_norm else x), intermediates

    def get_intermediate_layers(
        self,
        x: torch.Tensor,
        n: int | Sequence[int] = 1,
        reshape: bool = False,
        return_prefix_tokens: bool = False,
        norm: bool = False,
    ) -> list[Any]:
        """timm's (and DINO's) ``get_intermediate_layers``: the last ``n`` blocks' patch tokens, or the blocks
        listed in ``n``; (b, N', D) each, or (b, D, gh, gw) with ``reshape``. Blocks after the last asked for
        are not run."""
        return self.forward_intermediates(
            x,
            n,
            return_prefix_tokens=return_prefix_tokens,
            norm=norm,
            stop_early=True,
            output_fmt="NCHW" if reshape else "NLC",
            intermediates_only=True,
        )

    def _take_indices(self, indices: Any) -> list[int]:
        """timm's feature_take_indices: None -> all blocks, int n -> the last n, sequence -> those (0-based)."""
        depth = len(self.blocks)
        if indices is None:
            return list(range(depth))
        if isinstance(indices, Sequence) and not isinstance(indices, str):
            if not indices:
                raise ValueError("indices is empty; pass None for every block, n for the last n, or block indices")
            return sorted({check_index("block index", i, depth, f"a ViT of depth {depth}") for i in indices})
        n = check_positive_int("indices (the last n blocks)", indices)
        if n > depth:
            raise ValueError(f"indices {n} asks for the last {n} blocks of a ViT of depth {depth}")
        return list(range(depth - n, depth))

    # -- probe sites (TransformerLens's names) ----------------------------------------------------------------

    def probe_sites(self) -> dict[str, HookPoint]:
        """Every probe site by name, in the order a forward pass reaches them (shapes in docs/probes.md):
        ``hook_image`` (the input the patch embedding takes), ``hook_embed`` and ``hook_pos_embed`` (the tokens E_pos
        is added to, and E_pos); per block l,
        ``blocks.{l}.hook_resid_pre``, ``.ln1.hook_normalized``, ``.attn.hook_q``/``hook_k``/``hook_v``,
        ``.attn.hook_attn_scores``, ``.attn.hook_pattern``, ``.attn.hook_z``, ``.attn.hook_result``,
        ``.hook_attn_out``, ``.hook_resid_mid``, ``.ln2.hook_normalized``, ``.mlp.hook_pre``, ``.mlp.hook_post``,
        ``.hook_mlp_out``, ``.hook_resid_post``; then
        ``ln_final.hook_normalized`` (the final LayerNorm's output), with attention pooling (pool "map") its
        ``attn_pool.hook_q``/``hook_k``/``hook_v``, ``.hook_attn_scores``, ``.hook_pattern`` (b, h, 1, n) and
        ``.hook_z``, and ``hook_pooled`` (the pooling's output), in the order the head applies them. Each
        HookPoint's ``hooks`` are the functions attached now (none outside a :meth:`run_with_hooks` or
        :meth:`run_with_cache` call)."""
        pos = self.patch_embed.pos_embed
        sites = {"hook_image": self.patch_embed.hook_image, "hook_embed": pos.hook_embed}
        sites["hook_pos_embed"] = pos.hook_pos_embed
        for l, block in enumerate(self.blocks):
            sites.update({f"blocks.{l}.{name}": site for name, site in block.probe_sites().items()})
        sites.update(self.head.probe_sites())
        for name, site in sites.items():
            site.name = name
        return sites

    def run_with_hooks(self, x: torch.Tensor, fwd_hooks: Sequence[tuple[Any, Hook]] = ()) -> torch.Tensor:
        """``model(x)`` with each ``(name, fn)`` of ``fwd_hooks`` attached for this call only (TransformerLens's
        ``run_with_hooks``): ``fn(value, hook)`` reads the site's value and returns None to keep it or a tensor of
        its shape to replace it. ``name`` is a site's name or a callable name -> bool choosing sites. No hook
        remains after the call, also after an exception. An unknown name is a ValueError naming it and the
        closest sites."""
        sites = self.probe_sites()
        pairs = []
        for entry in fwd_hooks:
            if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and callable(entry[1])):
                raise TypeError(f"fwd_hooks holds (name, fn) pairs with fn(value, hook), got {entry!r}")
            name, fn = entry
            names = [n for n in sites if name(n)] if callable(name) else [name]
            for n in names:
                if n not in sites:
                    raise unknown_site(n, list(sites))
                pairs.append((sites[n], fn))
        with attached(pairs):
            return self(x)

    def run_with_cache(
        self, x: torch.Tensor, names_filter: Any = None, *, detach: bool = True
    ) -> tuple[torch.Tensor, ActivationCache]:
        """``(model(x), cache)``: the value of every site ``names_filter`` chooses (None: all; a name, a list of
        names or a callable name -> bool, as TransformerLens's), by name: ``cache["blocks.3.attn.hook_pattern"]``,
        or ``cache["pattern", 3]``. ``detach=False`` keeps the cached values in the autograd graph (gradients
        flow from them to the input and the weights, and ``torch.autograd.grad(out, cache[...])`` works). Only the
        chosen sites compute anything extra (A on a kernel that never forms it, the per-head result)."""
        sites = self.probe_sites()
        values: dict[str, torch.Tensor] = {}

        def keep(value: torch.Tensor, hook: HookPoint) -> None:
            values[hook.name] = value.detach() if detach else value

        with attached([(sites[name], keep) for name in chosen_sites(names_filter, sites)]):
            out = self(x)
        return out, ActivationCache(values, len(self.blocks))

    # -- fine-tuning -------------------------------------------------------------------------------------

    def freeze_backbone(self) -> list[str]:
        """Stop gradients everywhere but the classifier ``head.fc`` (and a distilled model's ``head.fc_dist``);
        returns the names of the parameters left trainable. With :meth:`reset_classifier` this is a frozen feature
        extractor under a new head."""
        trainable = []
        for name, param in self.named_parameters():
            param.requires_grad_(name.startswith(("head.fc.", "head.fc_dist.")))
            if param.requires_grad:
                trainable.append(name)
        return trainable

    def transforms(self) -> Preprocessing:
        """The callable that maps a PIL image to the (C, H, W) tensor this model expects, like torchvision's
        ``weights.transforms()``. Raises ValueError when the model records no preprocessing (a fresh model), or one
        that makes images of another size or channel count than the model's (:meth:`Preprocessing.check_fits`)."""
        if self.preprocessing is None:
            raise ValueError(
                "this model records no preprocessing; set one, e.g. model.preprocessing = "
                "Preprocessing.torchvision() (torchvision weights), Preprocessing.timm() (timm's augreg ViTs) or "
                f"Preprocessing.plain({self.config.image_size}, channels={self.config.in_channels}) "
                "(resize and scale to [0, 1], as vit-einops train)"
            )
        self.preprocessing.check_fits(self.patch_embed.image_size, self.patch_embed.in_channels)
        return self.preprocessing

    def set_attn_impl(self, impl: str | Sequence[str]) -> ViT:
        """Switch every attention layer to ``impl`` ("einsum", "chunked" or "sdpa"), or each layer to its own (a
        sequence of ``depth`` impls); returns the model. The weights and ``model.config`` are unchanged."""
        set_attn_impl(self, impl)
        return self

    def _apply(self, fn: Any, recurse: bool = True) -> ViT:
        # torch's one path for .to(), .cuda(), .half(): a kernel that would not run there is refused before any
        # tensor moves, so a refused move leaves the whole model where it was
        check_kernels_move(self, fn)
        return super()._apply(fn, recurse)

    # -- safe head swaps ---------------------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, nn.Module) and "_modules" in self.__dict__ and "head" in self._modules:
            if name == "head":
                if not isinstance(value, ClassificationHead):
                    # timm's habit `model.head = nn.Linear(D, K)` (or nn.Identity()): it becomes the classifier,
                    # keeping the final LayerNorm and the pooling, so the model still returns (b, K).
                    self.head.fc = self._as_classifier(value)
                    return
            elif name not in self._modules:
                hint = " (torchvision's ViT calls its classifier `heads`)" if name == "heads" else ""
                raise TypeError(
                    f"ViT has no stage {name!r}{hint}; its stages are patch_embed, blocks, head, and assigning "
                    f"a module would add one to its nn.Sequential forward. "
                    + head_swap_help(self.head.dim, self.head.in_features)
                )
        super().__setattr__(name, value)

    def _as_classifier(self, value: nn.Module) -> nn.Module:
        if isinstance(value, (nn.Linear, nn.Identity)):
            return value
        raise TypeError(
            f"model.head takes a ClassificationHead, or an nn.Linear({self.head.in_features}, K) / nn.Identity() "
            f"that becomes its classifier; got {type(value).__name__}. "
            + head_swap_help(self.head.dim, self.head.in_features)
        )



# ViT's keywords, as help(ViT) and editors show them: ViTConfig's fields with their defaults, then attn_impl.
ViT.__init__.__signature__ = inspect.Signature(
    [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        *(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
          for f in fields(ViTConfig)),
        inspect.Parameter("attn_impl", inspect.Parameter.KEYWORD_ONLY, default="einsum"),
    ]
)

def check_class_names(class_names: Any, num_classes: int) -> list[str] | None:
    """None, or ``num_classes`` names as a list of str."""
    if class_names is None:
        return None
    if isinstance(class_names, str) or not isinstance(class_names, Sequence):
        raise TypeError(f"class_names must be a list of str, got {type(class_names).__name__}")
    names = list(class_names)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"class_names must all be str, got {bad[0]!r} of type {type(bad[0]).__name__}")
    if len(names) != num_classes:
        raise ValueError(f"class_names has {len(names)} names for num_classes {num_classes}; expected one per class")
    return names


def _one(name: str, values: dict[str, Any]) -> Any:
    """The one value every module in ``values`` (name -> value) holds, or a ValueError naming where they differ."""
    distinct = dict.fromkeys(values.values())
    if len(distinct) > 1:
        first = {v: k for k, v in reversed(list(values.items()))}  # where each value first occurs
        where = ", ".join(f"{v!r} at {first[v]}" for v in distinct)
        raise ValueError(
            f"the model's {name} differs between its modules ({where}); ViTConfig holds one {name}, "
            f"so set them equal before reading model.config or saving"
        )
    return next(iter(distinct))


def read_config(model: ViT) -> ViTConfig:
    """The ViTConfig of ``model`` as it is now: what rebuilds the same structure and keys.

    That is the config it was built from, with what changes on a built model: ``num_classes`` and ``embedding`` (a
    classifier swap),
    ``pool`` (``reset_classifier``), ``representation_size`` (``del model.head.pre_logits``: the paper's fine-tuning
    drops the tanh layer), ``depth`` (blocks cut off, as timm's ``prune_intermediate_layers`` does) and the dropout
    rates (set on its nn.Dropout modules). A model changed into something no ViTConfig describes (a stage added, a
    block that is not a TransformerEncoderBlock, dropout rates that differ between modules) is a ValueError saying
    what differs.
    """
    stages = list(model._modules)
    if stages != ["patch_embed", "blocks", "head"]:
        raise ValueError(f"the ViT's stages are {stages}; a ViTConfig describes exactly patch_embed, blocks, head")
    pe, head = model.patch_embed, model.head
    if not isinstance(pe, PatchEmbedding) or not isinstance(head, ClassificationHead):
        raise TypeError(
            f"patch_embed is a {type(pe).__name__} and head a {type(head).__name__}; a ViTConfig describes "
            f"a PatchEmbedding and a ClassificationHead"
        )
    blocks = list(model.blocks)
    strangers = [f"blocks.{i}" for i, b in enumerate(blocks) if not isinstance(b, TransformerEncoderBlock)]
    if strangers:
        raise ValueError(f"{', '.join(strangers)} not TransformerEncoderBlock; a ViTConfig describes no other block")
    named = list(model.named_modules())
    dropouts = {n: m.p for n, m in named if isinstance(m, nn.Dropout) and not n.endswith(".attend.dropout")}
    attn_dropouts = {n: m.p for n, m in named if isinstance(m, nn.Dropout) and n.endswith(".attend.dropout")}
    fc = head.fc
    return replace(
        model._built_config,
        num_classes=head.num_classes,
        head_bias=fc.bias is not None if isinstance(fc, nn.Linear) else model._built_config.head_bias,
        embedding=head.embedding,
        pool=head.pool.mode,
        representation_size=head.pre_logits.fc.out_features if "pre_logits" in head._modules else None,
        depth=len(blocks),
        dropout=_one("dropout", dropouts),
        attn_dropout=_one("attn_dropout", attn_dropouts),
    )
