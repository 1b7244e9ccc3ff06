"""Dashboard specs (`spec.py`) as W&B saved views, with `wandb-workspaces` (the `wandb` extra: pip install -e
".[wandb]"), imported only here and only when publishing.

One saved view per table: the runs it compares (tag `table:<name>` and one of the spec's device tags) grouped by
`row`, the line panels (the row's mean and a min-max band; a random search: its lowest trial), the bar panel of the
end metric (a random search: the quantile its claims test, logged by the report run), the report's W&B Table.
Each view has a fixed internal name (from the table and scale), so publishing again updates it instead of adding one.
"""

from __future__ import annotations

import netrc
import os
from urllib.parse import urlparse

from highway_repro.report.identity import run_id


def offline_reason() -> str | None:
    """Why nothing can be published from here (None: an API key, an entity and wandb-workspaces are there)."""
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun"):
        return f"WANDB_MODE={os.environ['WANDB_MODE']}"
    if not os.environ.get("WANDB_API_KEY"):
        host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
        try:
            found = netrc.netrc().authenticators(host)
        except (OSError, netrc.NetrcParseError):
            found = None
        if not found:
            return "no W&B API key (WANDB_API_KEY or `wandb login`)"
    if not os.environ.get("WANDB_ENTITY"):
        return "WANDB_ENTITY is not set"
    try:
        import wandb_workspaces  # noqa: F401
    except ImportError:
        return "wandb-workspaces is not installed (pip install -e \".[wandb]\")"
    return None


def view_name(spec: dict) -> str:
    """The saved view's internal name: fixed per table and scale (`nw-<11 characters>-v`, W&B's form)."""
    return f"nw-{run_id('dashboard', spec['scale'], spec['table'])[:11]}-v"


def workspace(spec: dict, entity: str, project: str):
    """The saved view of one spec (not saved)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    panels = []
    for p in spec["panels"]:
        if p["kind"] == "line":
            panels.append(wr.LinePlot(title=p["title"], x=p["x"], y=p["y"], log_y=p["log_y"] or None,
                                      groupby_aggfunc=p["aggregate"], groupby_rangefunc=p["band"], aggregate=True,
                                      smoothing_type="none", layout=wr.Layout(w=12, h=8)))
        elif p["kind"] == "bar":
            panels.append(wr.BarPlot(title=p["title"], metrics=p["y"], groupby_aggfunc=p["aggregate"],
                                     groupby_rangefunc=p["band"], aggregate=True, layout=wr.Layout(w=12, h=8)))
        else:
            panels.append(wr.WeavePanelSummaryTable(table_name=p["key"], layout=wr.Layout(w=24, h=12)))
    view = ws.Workspace(
        entity=entity, project=project, name=spec["name"],
        sections=[ws.Section(name=spec["description"], panels=panels, is_open=True)],
        runset_settings=ws.RunsetSettings(filters=ws.And(*(ws.Tags().isin([t]) for t in spec["filter"]["tags"]),
                                                         ws.Tags().isin(spec["filter"]["devices"])),
                                          groupby=[ws.Config(k) for k in spec["group_by"]],
                                          pinned_columns=spec["columns"]))
    view._internal_name = view_name(spec)
    return view


def publish(specs: list[dict], entity: str, project: str) -> list[str]:
    """Save every spec's view on W&B; their URLs."""
    return [workspace(spec, entity, project).save().url for spec in specs]
