#!/usr/bin/env python3
"""PyTorch eager timings of hotops' model steps, for the comparisons in docs/models.md.

Each model is the one hotops' model families build (kernels/models, model_bert, model_bilstm,
model_cnn): same widths, same loss, torch.optim.AdamW(lr 1e-3, weight_decay 1e-2). f32 with TF32
off (torch.backends.cuda.matmul.allow_tf32 = cudnn.allow_tf32 = False), as hotops' f32 is strict f32.

Two times per (model, batch, direction), as hotops reports them:
  device: the batch already on the device; CUDA events around N back-to-back steps, per step;
  e2e:    the host clock around one step as a program pays it: batch copied from host memory,
          the step, the loss (train) or the logits (infer) back on the host.
The median of 5 samples is printed; one JSON object per line.

With --onnxruntime, the models' inference is exported to ONNX (eval mode) and timed in ONNX
Runtime's CPU session (intra-op threads = --threads, default all cores): the median over 5 samples
of back-to-back runs, the input already in host memory, as hotops times CPU inference.

usage: python3 tools/pytorch_models.py [--models mlp_tiny,bert_layer] [--device cuda|cpu] [--threads N]
                                       [--directions train,infer] [--batches 10,64] [--onnxruntime]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class BiLstm(nn.Module):
    def __init__(self, vocab=20000, emb=128, hidden=128, classes=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, tokens):  # [T, B]
        _, (h, _) = self.lstm(self.emb(tokens))
        return self.fc(torch.cat([h[0], h[1]], dim=1))


def keras_cnn():
    def block(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *block(3, 32), nn.MaxPool2d(3), nn.Dropout(0.25),
        *block(32, 64), *block(64, 64), nn.MaxPool2d(2), nn.Dropout(0.25),
        *block(64, 128), *block(128, 128), nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Flatten(), nn.Linear(128 * 21 * 21, 1024), nn.BatchNorm1d(1024), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(1024, 4))


def vgg_cifar():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Flatten(), nn.Linear(64 * 6 * 6, 512), nn.ReLU(), nn.Dropout(0.5), nn.Linear(512, 10))


def encoder(seq, pre_ln, eps):
    return nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True,
                                      norm_first=pre_ln, layer_norm_eps=eps)


# name -> (module factory, batches, make batch(b) -> (x, target), loss kind)
def models():
    cls = lambda shape, classes: lambda b: (torch.rand(b, *shape) * 2 - 1, torch.randint(0, classes, (b,)))
    tokens = lambda b: (torch.randint(0, 20000, (200, b)), torch.randint(0, 2, (b,)))
    seq = lambda n: lambda b: (torch.rand(b, n, 768) * 2 - 1, torch.rand(b, n, 768) * 2 - 1)
    return {
        "mlp_tiny": (lambda: mlp([13, 32, 16, 2]), [10, 64, 256, 1024, 4096], cls((13,), 2), "xent"),
        "mlp_mnist": (lambda: mlp([784, 512, 512, 10]), [128, 1024], cls((784,), 10), "xent"),
        "classifierdl": (lambda: mlp([768, 512, 2]), [32, 64, 256, 1024], cls((768,), 2), "xent"),
        "bert_layer": (lambda: encoder(128, False, 1e-12), [8, 32], seq(128), "mse"),
        "vit_layer": (lambda: encoder(197, True, 1e-6), [8, 32], seq(197), "mse"),
        "bilstm_imdb": (BiLstm, [32, 64, 256], tokens, "xent"),
        "keras_cnn": (keras_cnn, [16, 32, 64], cls((3, 256, 256), 4), "xent"),
        "vgg_cifar": (vgg_cifar, [32, 128, 512], cls((3, 32, 32), 10), "xent"),
    }


def measure(name, factory, batch, make, loss_kind, dev, train):
    torch.manual_seed(0)
    model = factory().to(dev)
    model.train(train)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
    x_host, t_host = make(batch)
    x, t = x_host.to(dev), t_host.to(dev)

    def step(x, t):
        if not train:
            with torch.no_grad():
                return model(x)
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = F.cross_entropy(out, t) if loss_kind == "xent" else F.mse_loss(out, t)
        loss.backward()
        opt.step()
        return loss

    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for _ in range(5):
        step(x, t)
    sync()
    # steps per sample: enough for ~50 ms
    t0 = time.perf_counter()
    step(x, t)
    sync()
    one = time.perf_counter() - t0
    n = max(1, min(200, int(0.05 / max(one, 1e-6))))
    device, e2e = [], []
    for _ in range(5):
        if dev == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(n):
                step(x, t)
            b.record()
            b.synchronize()
            device.append(a.elapsed_time(b) * 1e3 / n)
        else:
            t0 = time.perf_counter()
            for _ in range(n):
                step(x, t)
            device.append((time.perf_counter() - t0) * 1e6 / n)
        t0 = time.perf_counter()
        for _ in range(n):
            out = step(x_host.to(dev), t_host.to(dev))
            (out.item() if train else out.cpu())
        e2e.append((time.perf_counter() - t0) * 1e6 / n)
    return {"model": name, "device": dev, "direction": "train" if train else "infer", "batch": batch,
            "device_us": round(statistics.median(device), 1), "e2e_us": round(statistics.median(e2e), 1)}


def measure_ort(name, factory, batch, make, threads):
    import io
    import onnxruntime as ort
    torch.manual_seed(0)
    model = factory().eval()
    x, _ = make(batch)
    buf = io.BytesIO()
    torch.onnx.export(model, (x,), buf, input_names=["x"], output_names=["y"], dynamo=False)
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(buf.getvalue(), so, providers=["CPUExecutionProvider"])
    feed = {"x": x.numpy()}
    ref = model(x).detach().numpy()
    out = sess.run(None, feed)[0]
    err = float(abs(out - ref).max())
    for _ in range(5):
        sess.run(None, feed)
    t0 = time.perf_counter()
    sess.run(None, feed)
    one = time.perf_counter() - t0
    n = max(1, min(2000, int(0.1 / max(one, 1e-7))))
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            sess.run(None, feed)
        samples.append((time.perf_counter() - t0) * 1e6 / n)
    return {"model": name, "device": "onnxruntime-cpu", "direction": "infer", "batch": batch,
            "threads": threads or "default", "us": round(statistics.median(samples), 1),
            "max_abs_err_vs_torch": err, "ort": ort.__version__}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--directions", default="train,infer")
    ap.add_argument("--batches", default="")
    ap.add_argument("--onnxruntime", action="store_true")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    if a.threads:
        torch.set_num_threads(a.threads)
    table = models()
    names = a.models.split(",") if a.models else list(table)
    for name in names:
        factory, batches, make, loss_kind = table[name]
        if a.batches:
            batches = [int(b) for b in a.batches.split(",")]
        if a.onnxruntime:
            for b in batches:
                print(json.dumps(measure_ort(name, factory, b, make, a.threads)), flush=True)
            continue
        for d in a.directions.split(","):
            for b in batches:
                try:
                    r = measure(name, factory, b, make, loss_kind, a.device, d == "train")
                except torch.cuda.OutOfMemoryError as e:
                    r = {"model": name, "batch": b, "direction": d, "error": "out of memory"}
                    torch.cuda.empty_cache()
                print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
