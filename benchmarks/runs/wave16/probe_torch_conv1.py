"""PyTorch's time for the same first convolutions (b256, channels_last), forward and the
weight gradient alone (a first layer needs no input gradient), with 3 input channels and
padded to 4 and 8: what cuDNN gives the reference on these shapes."""
import torch
import torch.nn.functional as F

STEMS = {"resnet50": (224, 64, 7, 2, 3), "vgg16": (224, 64, 3, 1, 1),
         "googlenet": (224, 64, 7, 2, 3), "alexnet": (227, 96, 11, 4, 0)}
torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True


def timed(fn, reps=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps


for dtype, label in ((torch.bfloat16, "bf16"), (torch.float32, "tf32")):
    for name, (size, out, k, s, p) in STEMS.items():
        row = []
        for c in (3, 4, 8):
            x = torch.randn(256, c, size, size, device="cuda", dtype=dtype).to(
                memory_format=torch.channels_last)
            w = torch.randn(out, c, k, k, device="cuda", dtype=dtype).to(
                memory_format=torch.channels_last)
            y = F.conv2d(x, w, stride=s, padding=p)
            gy = torch.randn_like(y)
            f = timed(lambda: F.conv2d(x, w, stride=s, padding=p))
            g = timed(lambda: torch.ops.aten.convolution_backward(
                gy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1,
                [False, True, False]))
            row.append(f"C={c}: fwd {f:.3f} wgrad {g:.3f} ms")
        print(f"torch {label} {name:10s} " + " | ".join(row), flush=True)
