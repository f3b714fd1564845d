# A cumulative sum of the elements a mask keeps, along the last axis, in KernelBench's format (a
# kforge example): PyTorch runs it as a multiply and a sequential scan; one kernel does both.
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x, mask):
        return torch.cumsum(x * mask, dim=self.dim)


batch_size = 1024
length = 2048
dim = 1


def get_inputs():
    x = torch.rand(batch_size, length)
    mask = torch.randint(0, 2, x.shape).bool()
    return [x, mask]


def get_init_inputs():
    return [dim]
