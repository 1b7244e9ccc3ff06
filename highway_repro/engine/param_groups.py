"""Per-parameter learning-rate and weight-decay multipliers of the official Caffe solver.

The Highway Networks code (arXiv 1507.06228; REFERENCE.md A) sets, per layer blob:

    every bias (H biases, transform-gate biases, classifier bias): lr x 2, weight decay 0
    the classifier's weight:                                      lr x 1, weight decay x 10
    every other weight:                                           lr x 1, weight decay x 1

`caffe_param_groups` turns that into torch optimizer parameter groups. Each group
also carries `lr_mult` and `wd_mult` (extra keys torch optimizers keep untouched),
so a trainer or scheduler that *sets* the learning rate should set
`group["lr"] = lr_now * group["lr_mult"]`; schedulers that scale each group's
initial lr (LambdaLR, MultiStepLR, ...) keep the ratios by themselves.
"""

from __future__ import annotations

from torch import nn

from highway_repro.errors import HighwayError


def caffe_param_groups(model: nn.Module, lr: float, weight_decay: float,
                       classifier: str | None = "classifier") -> list[dict]:
    """Optimizer parameter groups "bias", "classifier_weight", "weight" (empty ones left out).

    A parameter is a bias when its name ends in "bias". `classifier` is the qualified
    name of the classifier module (its ".weight" gets 10x weight decay); None turns
    that rule off. Every parameter of `model` lands in exactly one group.
    """
    specs = {
        "bias": (2.0, 0.0),
        "classifier_weight": (1.0, 10.0),
        "weight": (1.0, 1.0),
    }
    members: dict[str, list] = {k: [] for k in specs}
    classifier_weight = None if classifier is None else f"{classifier}.weight"
    names = []
    for name, p in model.named_parameters():
        names.append(name)
        if name.endswith("bias"):
            members["bias"].append(p)
        elif name == classifier_weight:
            members["classifier_weight"].append(p)
        else:
            members["weight"].append(p)
    if classifier_weight is not None and not members["classifier_weight"]:
        raise HighwayError(f"caffe_param_groups classifier={classifier!r}: the model has no parameter "
                         f"{classifier_weight!r} (give the classifier module's name, or None; "
                         f"parameters end with: {names[-2:]})")
    return [
        {"params": members[k], "lr": lr * lr_mult, "weight_decay": weight_decay * wd_mult,
         "lr_mult": lr_mult, "wd_mult": wd_mult, "name": k}
        for k, (lr_mult, wd_mult) in specs.items() if members[k]
    ]
