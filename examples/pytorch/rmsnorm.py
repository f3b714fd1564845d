# RMS normalisation over the feature axis, in KernelBench's format (a kforge example, not a
# KernelBench file): `kforge run examples/pytorch/rmsnorm.py` imports and optimises it.
import torch
import torch.nn as nn


class Model(nn.Module):
    """x / sqrt(mean(x^2 over features) + eps)"""

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + self.eps)
        return x / rms


batch_size = 16
features = 64
dim1 = 64
dim2 = 64


def get_inputs():
    return [torch.randn(batch_size, features, dim1, dim2)]


def get_init_inputs():
    return [features]
