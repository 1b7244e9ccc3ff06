"""The table registry (`registry()`: name -> `TableSpec`, from `hn_tables.py` and `ht_tables.py`) and `build_table`."""

from __future__ import annotations

import functools
from pathlib import Path

from highway_repro.errors import make_folder
from highway_repro import files
from highway_repro.report.header import header
from highway_repro.report.hn_tables import DEMO, HN_ANALYSIS, HN_CIFAR, HN_FIG1, HN_TABLE1
from highway_repro.report.ht_tables import gate_zoo_table, ht_table, paper_anchor_table, placement_panels
from highway_repro.report.prose import prose
from highway_repro.report.runs import Run, one_device
from highway_repro.report.spec import render
from highway_repro.report.claims_file import comparisons_elsewhere, write_claims


@functools.cache
def registry() -> dict:
    """Table name -> spec, built on first use (the Highway Transformer tables read their rows from the sweep files);
    word-level tables are in perplexity, the others in bpc."""
    ht = {"ht_char_ptb": {}, "ht_word_ptb": {}, "ht_char_ptb_rt": {}, "ht_word_ptb_l3": {},
          "ht_enwik8_l6": {"time_column": True, "reference_curves": True}, "ht_enwik8_l12": {"time_column": True},
          "ht_placement_scan": {"extra_figure": placement_panels}, "ht_zoo_char_ptb": {}, "ht_zoo_char_ptb_rt": {},
          "ht_zoo_enwik8_l6": {}}
    return {"demo": DEMO, "hn_fig1": HN_FIG1, "hn_table1": HN_TABLE1, "hn_cifar": HN_CIFAR, "hn_analysis": HN_ANALYSIS,
            **{n: ht_table(n, "ppl" if n.startswith("ht_word") else "bpc", **kw) for n, kw in ht.items()},
            "ht_gate_zoo": gate_zoo_table(), "ht_paper_anchor": paper_anchor_table()}


def scale_section(files: list[tuple[str, str]]) -> str:
    """The table's scale files verbatim (each change from the paper's recipe and its evidence), folded so that the
    table stays on top."""
    if not files:
        return ""
    one = len(files) == 1
    return ("\n" + prose("recipe at scale", s="" if one else "s", verb_s="s" if one else "",
                         names=", ".join(f"`{path}`" for path, _ in files)) + "\n"
            + "".join(f"\n<details><summary>{path}</summary>\n\n```yaml\n{text.rstrip()}\n```\n\n</details>\n"
                      for path, text in files))


def findings_path(out: Path) -> Path:
    """What a table's follow-up step (`Target.after`: the gate analyses) found in the trained net, kept beside the
    table so that the report is rebuilt without the checkpoint."""
    out = Path(out)
    return out.with_name(out.name + "_findings.md")


def build_table(name: str, runs: list[Run], out: Path, meta: dict) -> str:
    """Write `<out>.md`, `.csv`, `.png` (if the table has a figure) and `.claims.json`; return the Markdown. meta
    (the runner's): {"commands", "scale", "wall_s", "scale_files": [(path, text)], "findings": Markdown, ...}."""
    tables = registry()
    if name not in tables:
        raise ValueError(f"table {name!r} is not known (valid: {', '.join(sorted(tables))})")
    spec = tables[name]
    out = Path(out)
    runs, left_out = one_device(runs)
    if left_out:
        meta = {**meta, "other_device": left_out}
    t, body, csv_text = render(spec, runs, name, comparisons_elsewhere(out, name, meta.get("part_of")))
    text = header(spec.title, runs, meta) + body
    make_folder(out.parent)
    if spec.figure is not None and t.rows:
        fig = out.with_name(out.name + ".png")
        spec.figure(t, fig)
        text += f"\n![{fig.name}]({fig.name})\n"
    if meta.get("findings"):
        text += "\n" + meta["findings"].rstrip() + "\n"
    text += scale_section(meta.get("scale_files") or [])
    files.write_atomic(out.with_name(out.name + ".md"), text)
    files.write_atomic(out.with_name(out.name + ".csv"), csv_text)
    write_claims(name, t, out, meta, runs=len(runs))
    return text
