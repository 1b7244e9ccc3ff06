"""The official repositories of `make parity` (scripts/parity.py) and the tools that compare a model of ours with one
of them: where the code comes from (pinned commits, cloned or given as checkouts), the run-time patches that let it
run on a CPU-only, current torch (applied to a cached copy, never to the checkout), the import of its files, and the
helpers that copy our weights across and measure differences.

Nothing of the official code is ever copied into this repository.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import shutil
import subprocess
import sys
from pathlib import Path

import torch

OFFICIAL = {
    "transformer-xl": {
        "url": "https://github.com/kimiyoung/transformer-xl",
        "commit": "44781ed21dbaec88b280f74d9ae2877f52b492a5",
        "files": ["pytorch/mem_transformer.py", "pytorch/utils/proj_adaptive_softmax.py",
                  "pytorch/utils/log_uniform_sampler.py"],
    },
    "Highway-Transformer": {
        "url": "https://github.com/cyk1337/Highway-Transformer",
        "commit": "24f148d32fda734f6fe4a1baf6d59aa9503d8a49",
        "files": ["pytorch/mem_transformer.py", "pytorch/utils/proj_adaptive_softmax.py",
                  "pytorch/utils/log_uniform_sampler.py"],
    },
    "R-transformer": {
        "url": "https://github.com/DSE-MSU/R-transformer",
        "commit": "3103cdfd117c2d82d64fb5ca56a6399bd30684e4",
        "files": ["models/RTransformer.py", "language_word/model.py"],
    },
}

_CUDA_PROBE = [
    ("pytorch/utils/proj_adaptive_softmax.py", "int(torch.version.cuda.split('.')[0])",
     "int((torch.version.cuda or '0.0').split('.')[0])", 1,
     "CUDA version probe at import: torch.version.cuda is None on a CPU-only torch"),
    ("pytorch/utils/proj_adaptive_softmax.py", "int(torch.version.cuda.split('.')[1])",
     "int((torch.version.cuda or '0.0').split('.')[1])", 1, "(same, minor version)"),
]
# (file, old text, new text, expected number of occurrences, why)
PATCHES = {
    "transformer-xl": _CUDA_PROBE + [
        ("pytorch/mem_transformer.py", ".byte()", ".bool()", 3,
         "uint8 attention masks: masked_fill rejects them in current torch (deprecated since 1.2)"),
    ],
    "Highway-Transformer": _CUDA_PROBE + [
        ("pytorch/mem_transformer.py", ".byte()", ".bool()", 3,
         "uint8 attention masks: masked_fill rejects them in current torch (deprecated since 1.2)"),
    ],
    "R-transformer": [
        ("models/RTransformer.py", ".unsqueeze(1).cuda()", ".unsqueeze(1)", 1,
         "causal mask moved to the GPU in __init__: CPU run"),
        ("models/RTransformer.py", "torch.LongTensor(idx).cuda()", "torch.LongTensor(idx)", 1,
         "local-RNN window index moved to the GPU in __init__: CPU run"),
        ("models/RTransformer.py", "torch.zeros((self.ksize-1, input_dim)).cuda()",
         "torch.zeros((self.ksize-1, input_dim))", 1, "local-RNN zero padding moved to the GPU: CPU run"),
    ],
}

TOL_FP32 = 1e-5  # where the conventions are set equal
TOL_FP64 = 1e-8  # the official code keeps two fp32 steps in fp64 (~1e-9 at most here; see the notes of the report)


def _git_commit(path: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def clone_official(cache: Path) -> Path:
    """git clone every repository of OFFICIAL into cache/checkouts at its pinned commit (needs a network)."""
    dest = cache / "checkouts"
    dest.mkdir(parents=True, exist_ok=True)
    for name, spec in OFFICIAL.items():
        repo = dest / name
        if _git_commit(repo) == spec["commit"]:
            continue
        if repo.exists():
            shutil.rmtree(repo)
        try:
            subprocess.run(["git", "clone", "--quiet", spec["url"], str(repo)], check=True, timeout=600)
            subprocess.run(["git", "-C", str(repo), "checkout", "--quiet", spec["commit"]], check=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            raise SystemExit(f"parity: could not clone {spec['url']} at {spec['commit']} ({e}); without a "
                             f"network pass --official-dir DIR with checkouts {', '.join(OFFICIAL)} in DIR")
    return dest


def prepare_official(official_dir: Path, cache: Path) -> dict[str, dict]:
    """Copy the needed official files into the cache, patch the copy; -> {name: {path, commit, patches}}."""
    out = {}
    for name, spec in OFFICIAL.items():
        src = official_dir / name
        if not src.is_dir():
            raise SystemExit(f"parity: --official-dir {official_dir} has no folder {name!r} "
                             f"(expected a checkout of {spec['url']} at commit {spec['commit']})")
        commit = _git_commit(src)
        dest = cache / f"{name}-{(commit or 'unknown')[:12]}"
        if dest.exists():
            shutil.rmtree(dest)
        for rel in spec["files"]:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, dest / rel)
        applied = []
        for rel, old, new, count, why in PATCHES[name]:
            f = dest / rel
            text = f.read_text()
            if text.count(old) != count:
                raise SystemExit(f"parity: patch for {name}/{rel} expects {count} x {old!r}, found "
                                 f"{text.count(old)} (commit {commit}; pinned {spec['commit']})")
            f.write_text(text.replace(old, new))
            applied.append(f"{rel}: `{old}` -> `{new}` ({count}x): {why}")
        out[name] = {"path": dest, "commit": commit or "unknown (not a git checkout)", "patches": applied,
                     "pinned": commit == spec["commit"]}
    return out


def _import_file(path: Path, name: str, extra_paths: list[Path], shadow: tuple[str, ...]):
    """Import one official file as module `name`; its bare imports (`shadow`) resolve in `extra_paths` only."""
    saved_path, saved_mods = list(sys.path), {k: sys.modules.pop(k) for k in shadow if k in sys.modules}
    sys.path[:0] = [str(p) for p in extra_paths]
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved_path
        for k in shadow:
            sys.modules.pop(k, None)
        sys.modules.update(saved_mods)
    return mod


def load_official(prepared: dict) -> dict:
    mods = {}
    for name in ("transformer-xl", "Highway-Transformer"):
        base = prepared[name]["path"] / "pytorch"
        mods[name] = _import_file(base / "mem_transformer.py", f"official_{name.replace('-', '_')}_mem_transformer",
                                  [base / "utils"], ("proj_adaptive_softmax", "log_uniform_sampler"))
    base = prepared["R-transformer"]["path"]
    mods["R-transformer"] = _import_file(base / "language_word" / "model.py", "official_r_transformer_model",
                                         [base / "models"], ("RTransformer",))
    return mods


# ---------------------------------------------------------------------------------------------------
# Comparing a model of ours with an official one: weights copied across, differences measured.
# ---------------------------------------------------------------------------------------------------

def perturb_(model: torch.nn.Module, seed: int) -> None:
    """Add N(0, 0.05) to every parameter: no bias or norm stays at its exact initial value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * 0.05)


def copy_into(official: torch.nn.Module, mapped: dict[str, torch.Tensor], unused_ok) -> list[str]:
    """Copy mapped tensors into the official model; every official parameter must be mapped or be a
    documented unused one (`unused_ok(name)`); returns the names left unmapped."""
    buffers = {k for k, _ in official.named_buffers()}  # e.g. the sinusoid frequencies: not parameters
    state = {k: v for k, v in official.state_dict().items() if k not in buffers}
    for k, v in mapped.items():
        if k not in state:
            raise ValueError(f"mapping produced {k!r}, which the official model does not have")
        if tuple(state[k].shape) != tuple(v.shape):
            raise ValueError(f"mapping gives {k!r} shape {tuple(v.shape)}, official {tuple(state[k].shape)}")
    left = [k for k in state if k not in mapped]
    bad = [k for k in left if not unused_ok(k)]
    if bad:
        raise ValueError(f"official parameters without a mapped value: {bad}")
    with torch.no_grad():
        for k, v in mapped.items():
            state[k].copy_(v)
    return left


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def grad_diff(official: torch.nn.Module, ours_grads: dict[str, torch.Tensor], skip) -> tuple[float, float]:
    """max |official grad - mapped our grad| over the official parameters that have a counterpart; also
    the largest official gradient (scale). Unmapped official parameters must have no gradient."""
    worst, scale = 0.0, 0.0
    for name, p in official.named_parameters():
        if skip(name):
            if p.grad is not None and p.grad.abs().max().item() != 0.0:
                raise AssertionError(f"official {name} was expected unused but has a gradient")
            continue
        if name not in ours_grads:
            raise AssertionError(f"no gradient of ours maps to official {name}")
        worst = max(worst, maxdiff(p.grad, ours_grads[name]))
        scale = max(scale, p.grad.abs().max().item())
    return worst, scale


def quiet():
    return contextlib.redirect_stdout(io.StringIO())
