"""The network: the config and its field registry, the layers (patch embedding, attention and its kernels,
RoPE, blocks, head) and the ViT."""
