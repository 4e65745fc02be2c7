"""Training curves: the training loss and the held-out accuracy per epoch, one or more runs.

    plot_curves("runs/curve.png", {"minidnn": report["epochs"]}, title="tiny_cnn")

Each run is the list of epoch records a run report holds under `epochs` (dicts with `epoch`,
`train_loss` and, when the held-out set was evaluated, `accuracy`). matplotlib is imported
here only, when a figure is asked for.
"""
from __future__ import annotations


def plot_curves(path: str, runs: dict, title: str = "") -> None:
    """Write a PNG (or any format matplotlib writes, by `path`'s extension) with two panels:
    training loss per epoch (left) and held-out accuracy per epoch (right), a line per run.

    runs: {label: [epoch record, ...]}.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    for label, records in runs.items():
        epochs = [r["epoch"] for r in records]
        ax_loss.plot(epochs, [r["train_loss"] for r in records], marker="o", label=label)
        scored = [r for r in records if r.get("accuracy") is not None]
        ax_acc.plot([r["epoch"] for r in scored], [r["accuracy"] for r in scored], marker="o",
                    label=label)
    ax_loss.set(xlabel="epoch", ylabel="training loss (mean over the epoch)")
    ax_acc.set(xlabel="epoch", ylabel="held-out accuracy")
    for ax in (ax_loss, ax_acc):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # epochs are whole
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
