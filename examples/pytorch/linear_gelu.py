# A linear layer followed by GELU, in KernelBench's level-2 style (a kforge example): no template
# covers the pair, so the first kernel comes from a model (`kforge run ... --llm llm.yaml`).
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x))


batch_size = 256
in_features = 512
out_features = 512


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
