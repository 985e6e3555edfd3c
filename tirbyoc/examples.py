"""Example models: the seed MLP (800 -> Linear(500) -> ReLU -> Linear(10)) in three forms.

* ``mlp_relax``: written directly in Relax, ``nn.Linear``-style (``matmul(x, W^T) + b``);
* ``mlp_torch``: a ``torch.nn`` module imported with ``torch.export`` and
  ``from_exported_program``;
* ``mlp_onnx``: an ONNX graph (``Gemm`` with ``transB=1``, ``Relu``) imported with
  ``from_onnx``.

All take the weights from ``mlp_weights`` so that the three can be compared.
"""

from __future__ import annotations

import numpy as np

from . import _tvm as T
from .torch_frontend import from_exported_program

SEED_SIZES = (800, 500, 10)


def mlp_weights(sizes=SEED_SIZES, seed=0):
    """``[(W [out, in], b [out]), ...]`` float32, scaled like ``nn.Linear``'s init."""
    rng = np.random.default_rng(seed)
    layers = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        bound = 1.0 / np.sqrt(fan_in)
        w = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
        b = rng.uniform(-bound, bound, fan_out).astype(np.float32)
        layers.append((w, b))
    return layers


def mlp_numpy(x, layers):
    """The reference: float64 numpy."""
    h = x.astype(np.float64)
    for i, (w, b) in enumerate(layers):
        h = h @ w.T.astype(np.float64) + b
        if i + 1 < len(layers):
            h = np.maximum(h, 0.0)
    return h.astype(np.float32)


def mlp_relax(batch=64, layers=None, *, bind_weights=True, activation="relu",
              activation_last=False):
    """The MLP as a Relax module; ``batch=None`` gives a symbolic batch dimension.

    With ``bind_weights`` the weights are constants in the module (the deployment case);
    otherwise ``main`` takes ``(x, w0, b0, w1, b1, ...)``. The activation follows every
    layer but the last, and the last too with ``activation_last``.
    """
    R = T.relax_ns
    layers = layers if layers is not None else mlp_weights()
    rows = batch if batch is not None else T.tirx_ns.Var("batch", "int64")
    bb = R.BlockBuilder()
    x = R.Var("x", R.TensorType((rows, layers[0][0].shape[1]), "float32"))
    params = [x]
    if not bind_weights:
        for i, (w, b) in enumerate(layers):
            params += [R.Var(f"w{i}", R.TensorType(w.shape, "float32")),
                       R.Var(f"b{i}", R.TensorType(b.shape, "float32"))]
    with bb.function("main", params):
        with bb.dataflow():
            h = x
            for i, (w, b) in enumerate(layers):
                wv = R.const(w) if bind_weights else params[1 + 2 * i]
                bv = R.const(b) if bind_weights else params[2 + 2 * i]
                h = bb.emit(R.op.matmul(h, bb.emit(R.op.permute_dims(wv, [1, 0]))))
                h = bb.emit(R.op.add(h, bv))
                if i + 1 < len(layers) or activation_last:
                    h = bb.emit(getattr(R.op.nn, activation)(h))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def mlp_torch_module(layers=None):
    """A ``torch.nn.Sequential`` MLP holding ``layers``' weights."""
    import torch

    layers = layers if layers is not None else mlp_weights()
    mods = []
    for i, (w, b) in enumerate(layers):
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
        mods.append(lin)
        if i + 1 < len(layers):
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods).eval()


def mlp_torch(batch=64, layers=None, *, dynamic_batch=False):
    """(Relax module, torch module) via ``torch.export`` + ``from_exported_program``."""
    import torch

    model = mlp_torch_module(layers)
    example = torch.zeros(batch, model[0].in_features)
    shapes = {"input": {0: torch.export.Dim("batch", min=1, max=1 << 16)}} if dynamic_batch \
        else None
    ep = torch.export.export(model, (example,), dynamic_shapes=shapes)
    return from_exported_program(ep), model


def mlp_onnx_model(layers=None):
    """The MLP as an ONNX ModelProto (``Gemm`` transB=1 + ``Relu``), symbolic batch."""
    from onnx import TensorProto, helper, numpy_helper

    layers = layers if layers is not None else mlp_weights()
    nodes, inits, h = [], [], "x"
    for i, (w, b) in enumerate(layers):
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        out = f"h{i}" if i + 1 < len(layers) else "y"
        nodes.append(helper.make_node("Gemm", [h, f"w{i}", f"b{i}"], [out], transB=1))
        h = out
        if i + 1 < len(layers):
            nodes.append(helper.make_node("Relu", [h], [f"r{i}"]))
            h = f"r{i}"
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", layers[0][0].shape[1]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", layers[-1][0].shape[0]])],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mlp_onnx(layers=None):
    """(Relax module, ONNX model) via ``tirbyoc.from_onnx``."""
    from .onnx_frontend import from_onnx

    model = mlp_onnx_model(layers)
    return from_onnx(model), model


# ---- convolutional networks (PyTorch) ----


def small_cnn_torch(seed=0):
    """conv3x3(3->32) + relu, conv3x3(32->64) + relu, global average pool, Linear(64, 10):
    a small CNN for 32x32 images. Eval mode."""
    import torch

    nn = torch.nn
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).eval()


def _randomize_batch_norms(model, seed):
    """Non-trivial running statistics and affine parameters in every batch norm, so that
    folding them is tested (a fresh BatchNorm2d is the identity)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                c = mod.num_features
                mod.running_mean.copy_(torch.rand(c, generator=g) - 0.5)
                mod.running_var.copy_(torch.rand(c, generator=g) + 0.5)
                mod.weight.copy_(torch.rand(c, generator=g) + 0.5)
                mod.bias.copy_(torch.rand(c, generator=g) - 0.5)
    return model


def resnet_torch(layers=(2, 2, 2, 2), widths=(64, 128, 256, 512), classes=1000, seed=0):
    """A ResNet of basic blocks written with ``torch.nn`` (ResNet-18 by default): a 7x7/2
    conv, batch norm, relu and 3x3/2 max pool stem, stages of two-conv blocks with batch
    norms and identity or 1x1/2 projection shortcuts, global average pool, Linear.
    ``layers=(1, 1), widths=(64, 128)`` is the two-block network of the convolution
    issue. Eval mode, batch norms with random statistics."""
    import torch

    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                           nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.short is None else self.short(x)))

    torch.manual_seed(seed)
    mods = [nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]),
            nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = widths[0]
    for i, (count, width) in enumerate(zip(layers, widths)):
        for j in range(count):
            mods.append(Block(cin, width, 2 if j == 0 and i > 0 else 1))
            cin = width
    mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return _randomize_batch_norms(nn.Sequential(*mods), seed).eval()


def mobilenet_torch(width=1.0, classes=1000, seed=0):
    """A MobileNet (v1) written with ``torch.nn``: a 3x3/2 conv stem, then thirteen
    depthwise-separable blocks (3x3 depthwise conv, batch norm, ReLU6, 1x1 conv, batch
    norm, ReLU6), global average pool, Linear. Eval mode, batch norms with random
    statistics."""
    import torch

    nn = torch.nn

    def unit(cin, cout, k, stride, groups=1):
        return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                nn.BatchNorm2d(cout), nn.ReLU6()]

    plan = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + \
        [(1024, 2), (1024, 1)]
    torch.manual_seed(seed)
    cin = int(32 * width)
    mods = unit(3, cin, 3, 2)
    for cout, stride in plan:
        cout = int(cout * width)
        mods += unit(cin, cin, 3, stride, groups=cin) + unit(cin, cout, 1, 1)
        cin = cout
    mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return _randomize_batch_norms(nn.Sequential(*mods), seed).eval()


# ---- transformers (PyTorch) ----

def gpt2_block_torch(d=768, heads=12, seed=0):
    """A GPT-2-style block written with ``torch.nn``: pre-LayerNorm causal self-attention
    (one qkv Linear, q @ k^T / sqrt(d_head), masked softmax, @ v, projection, residual),
    then a pre-LayerNorm GELU(tanh) MLP of width 4d with a residual. Eval mode."""
    import math

    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (t.view(b, s, heads, d // heads).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // heads)
            mask = torch.tril(torch.ones(s, s, dtype=torch.bool))
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
            h = torch.nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh")
            return x + self.out(h)

    torch.manual_seed(seed)
    return Block().eval()


def encoder_layer_torch(d=768, heads=12, ff=3072, seed=0):
    """``torch.nn.TransformerEncoderLayer`` (GELU, batch first, no dropout), eval mode."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.TransformerEncoderLayer(d, heads, ff, activation="gelu", batch_first=True,
                                            dropout=0.0).eval()


def import_torch(model, example, *, dynamic_seq=False):
    """``torch.export`` + ``from_exported_program`` (weights as constants, tirbyoc's
    converters for what TVM's frontend gets wrong: ``torch_frontend``); with
    ``dynamic_seq`` the second axis of the input is a symbolic sequence length."""
    import torch

    shapes = ({"x" if "x" in _arg_names(model) else _arg_names(model)[0]:
               {1: torch.export.Dim("seq", min=2, max=512)}} if dynamic_seq else None)
    with torch.no_grad():
        ep = torch.export.export(model, (example,), dynamic_shapes=shapes)
    return from_exported_program(ep, keep_params_as_input=False)


def _arg_names(model):
    import inspect

    return [p for p in inspect.signature(model.forward).parameters]
